"""Local commands for the lab: run one with a timeout (every failure a :class:`LabError`), ssh to a
node, and look up namespaces, links and processes on this machine."""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from runbook.errors import LabError


def tail_text(text: str, n: int = 600) -> str:
    text = (text or "").strip()
    return text if len(text) <= n else "…" + text[-n:]


def file_tail(path: Path, n: int = 20) -> str:
    """The last ``n`` lines of a log file ('' when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def run_local(argv: list[str], *, timeout: float = 30, check: bool = True, input: str | bytes | None = None,
              stdin=None, what: str = "", fix: str = "", node: str = "", env: dict | None = None,
              text: bool = True) -> subprocess.CompletedProcess:
    """Run a local command with a timeout; raise LabError on failure (when check)."""
    try:
        kw = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL if stdin is None else stdin}
        return_ = subprocess.run(argv, capture_output=True, text=text, timeout=timeout, env=env, **kw)
    except FileNotFoundError:
        raise LabError(what or f"cannot run {argv[0]}", node=node, observed=f"{argv[0]}: command not found",
                       expected=f"{argv[0]} installed", fix=fix or "install the lab's apt packages "
                       "(`up` does this itself when run as root)") from None
    except subprocess.TimeoutExpired as exc:
        out = exc.stderr or exc.stdout or b""
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        raise LabError(what or f"command timed out: {shlex.join(argv)}", node=node,
                       observed=f"no result after {timeout:.0f} s; {tail_text(out, 300)}",
                       expected=f"done within {timeout:.0f} s",
                       fix=fix or "the machine may be overloaded; retry, or run `down` then `up`") from None
    if check and return_.returncode != 0:
        err = return_.stderr if text else return_.stderr.decode(errors="replace")
        raise LabError(what or f"command failed: {shlex.join(argv)}", node=node,
                       observed=f"rc={return_.returncode}: {tail_text(err)}", expected="rc=0", fix=fix)
    return return_


def ssh(cfg: Path, target: str, command: str, *, timeout: float = 30, check: bool = True,
        stdin=None, input=None, what: str = "", text: bool = True) -> subprocess.CompletedProcess:
    """Run ``command`` on a lab node (alias or IP) with OpenSSH and the lab's ssh_config."""
    return run_local(["ssh", "-F", str(cfg), target, command], timeout=timeout, check=check, stdin=stdin,
                     input=input, what=what or f"ssh {target} {command[:60]!r}", node=target, text=text)


# --------------------------------------------------------------------------------------------------
# processes and namespaces of this machine

def netns_exists(ns: str) -> bool:
    return Path("/run/netns", ns).exists()


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def proc_comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _proc_nspid(pid: int) -> list[int]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return False


def netns_pids(ns: str) -> list[int]:
    if not netns_exists(ns):
        return []
    res = run_local(["ip", "netns", "pids", ns], timeout=10, check=False)
    return [int(x) for x in res.stdout.split() if x.isdigit()]


def node_pid1(ns: str) -> int | None:
    """Host PID of the node's PID 1 (the sshd that nodeinit.sh became): of the processes in the netns that are PID 1
    of their PID namespace, the one in the shallowest. A container a node's dockerd runs (a rehearsal's docker-runtime
    rank) is PID 1 of a namespace nested in the node's; once the host's PIDs wrap (pid_max 32768) its host PID can
    sort before the node's sshd, and taking it made `lab status` call both nodes dead and the next `up` rebuild the lab."""
    best: tuple[int, int] | None = None
    for pid in netns_pids(ns):
        nspid = _proc_nspid(pid)
        if len(nspid) >= 2 and nspid[-1] == 1 and (best is None or len(nspid) < best[0]):
            best = (len(nspid), pid)
    return best[1] if best else None

