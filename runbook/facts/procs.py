"""Process facts (pure parsers): ``ps`` rows with state and wait channel, and a process's
environment read from ``/proc/<pid>/environ``.

A rank in ``D`` state waiting in ``folio_wait_bit_common`` / ``nfs_*`` / ``rpc_wait_*`` is blocked
on I/O (an NFS-served model under load) and cannot be killed until the I/O completes.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

#: the processes of this user and of root (the containers' ranks, the system's own) that are vLLM's or in
#: uninterruptible sleep, with their arguments; other users' processes only when in uninterruptible sleep, and by
#: name only (``comm``): their command lines stay out of a bundle
PS_CMD = ("ps -o pid,ppid,stat,wchan:32,etimes,rss,args -u \"$(id -u),0\" 2>/dev/null | "
          "awk 'NR==1 || $3 ~ /^D/ || /vllm|VLLM|EngineCore|ray::|spark-runbook/' | grep -v ' awk ' | head -n 300; "
          "ps -N -u \"$(id -u),0\" -o pid,ppid,stat,wchan:32,etimes,rss,comm --no-headers 2>/dev/null | "
          "awk '$3 ~ /^D/' | head -n 100")
D_THREADS_CMD = ("ps -eLo pid,tid,stat,wchan:32,etimes,comm 2>/dev/null | awk 'NR==1 || $3 ~ /^D/' | "
                 "head -n 300")

#: environment variables worth keeping in a bundle (everything else is left out: it may hold secrets
#: the redactor does not know)
ENV_KEEP = r"^(VLLM_|NCCL_|GLOO_|TP_|MASTER_|HF_|HUGGING|TRANSFORMERS_|CUDA_|PYTORCH_|TORCH|OMP_|UCX_|" \
           r"RAY_|DSV4|DSV41_|LD_LIBRARY_PATH=|PATH=|HOME=|USER=|PYTHONPATH=|PYTHONUNBUFFERED=)"
#: and of those, never a name that says it holds a secret (VLLM_API_KEY, HF_TOKEN, a *_PASSWORD a recipe adds)
ENV_DROP = r"^([A-Za-z0-9]+_)*(KEY|KEYS|TOKEN|SECRET|SECRETS|PASS|PASSWORD|PASSWD|CRED|CREDS|CREDENTIALS|AUTH|" \
           r"COOKIE)(_[A-Za-z0-9_]*)?="


def proc_environ_cmd(pid_file: str) -> str:
    """The kept part of the environment of the process whose pid is in ``pid_file`` (a shell word,
    quoted by the caller: it may use ``"$HOME"``)."""
    return (f"pf={pid_file}; pid=$(cat \"$pf\" 2>/dev/null); "
            f"if [ -n \"$pid\" ] && [ -r /proc/$pid/environ ]; then "
            f"tr '\\0' '\\n' < /proc/$pid/environ | grep -E '{ENV_KEEP}' | grep -Eiv '{ENV_DROP}' | sort; "
            f"else echo \"no readable process for pid file $pf\"; fi")


def proc_cmdline_cmd(pid_file: str) -> str:
    """The command line of the process whose pid is in ``pid_file`` (a quoted shell word)."""
    return (f"pf={pid_file}; pid=$(cat \"$pf\" 2>/dev/null); "
            f"if [ -n \"$pid\" ] && [ -r /proc/$pid/cmdline ]; then tr '\\0' ' ' < /proc/$pid/cmdline; echo; "
            f"else echo \"no readable process for pid file $pf\"; fi")


def container_env_cmd(container: str) -> str:
    c = shlex.quote(container)
    return (f"docker inspect --format '{{{{range .Config.Env}}}}{{{{println .}}}}{{{{end}}}}' {c} 2>&1 | "
            f"grep -E '{ENV_KEEP}|Error' | grep -Eiv '{ENV_DROP}' | sort")


def parse_environ(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines -> dict (the last assignment wins, as in a shell)."""
    out = {}
    for line in (text or "").splitlines():
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


@dataclass
class Proc:
    pid: int
    stat: str
    wchan: str = ""
    etimes: int | None = None
    cmd: str = ""             # args (or comm)
    tid: int | None = None

    @property
    def uninterruptible(self) -> bool:
        return self.stat.startswith("D")


def parse_ps(text: str) -> list[Proc]:
    """Parse :data:`PS_CMD` / :data:`D_THREADS_CMD` output (columns read from the header). Sample::

            PID    PPID STAT WCHAN                             ELAPSED   RSS COMMAND
           4242       1 Dl   folio_wait_bit_common                 912 81234 python3 -m vllm.entrypoints...
    """
    lines = [l for l in (text or "").splitlines() if l.strip() and not l.lstrip().startswith("#")]
    if not lines:
        return []
    header = lines[0].split()
    if "PID" not in header or "STAT" not in header:
        return []
    ncols = len(header)
    out = []
    for line in lines[1:]:
        parts = line.split(None, ncols - 1)
        if len(parts) < ncols - 1 or not parts[0].isdigit():
            continue
        row = dict(zip(header, parts))
        try:
            et = row.get("ELAPSED") or row.get("ETIMES")
            out.append(Proc(pid=int(row["PID"]), stat=row.get("STAT", ""), wchan=row.get("WCHAN", "").strip("-"),
                            etimes=int(et) if et and et.isdigit() else None,
                            cmd=(row.get("COMMAND") or row.get("CMD") or "").strip(),
                            tid=int(row["TID"]) if row.get("TID", "").isdigit() else None))
        except (KeyError, ValueError):
            continue
    return out
