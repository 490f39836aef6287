"""The one remote-command layer: fabric ``Connection``s to the nodes.

* ``node.read(cmd)`` is a fact probe: read-only, runs even in dry-run, never raises on a
  non-zero exit (callers read ``.ok``).
* ``node.run(cmd)`` changes a node: in dry-run it is recorded and not executed; otherwise a
  non-zero exit raises ``RemoteError`` (with the tails of stdout/stderr) unless ``warn=True``.
* Every command has a timeout, never forwards local stdin (``in_stream=False``: required under
  pytest and in papermill kernels), and is appended to the run's command log with secrets masked.
* Host keys are verified against a known_hosts file; only a profile that allows it (the lab)
  may accept new keys.
"""
from __future__ import annotations

import dataclasses
import fcntl
import io
import json
import os
import posixpath
import re
import shlex
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, TypeVar

from .console import LineWriter
from .errors import BusyError, RemoteError, RunbookError
from .secrets import Redactor, default_redactor

T = TypeVar("T")

DEFAULT_READ_TIMEOUT = 30.0
DEFAULT_RUN_TIMEOUT = 120.0
TAIL_LINES = 20

# Rehearsal hook (REHEARSAL=1 only): the node-private lab directory whose bin/ holds the simulators of the
# hardware-only tools (installed by runbook.lab.sim). Every node command of a rehearsal runs with it first
# on PATH; the prefix is part of the command as run and as logged in commands.jsonl.
REHEARSAL_SIM_DIR = "/mnt/nvme/.rehearsal/sim"


def rehearsal_path_prefix(profile) -> str:
    """``export PATH=<sim>/bin:"$PATH"; `` for a rehearsed profile, else ''."""
    return f'export PATH={REHEARSAL_SIM_DIR}/bin:"$PATH"; ' if profile.rehearsal else ""


def quote(*parts: Any) -> str:
    """Join argv parts into one shell-safe command string."""
    return " ".join(shlex.quote(str(p)) for p in parts)


def private_dir_command(*dirs: str) -> str:
    """Shell that makes each directory (a parent before its child) private to the remote user before a tool is
    shipped into it: created with umask 077, refused when it is a symlink or owned by another user (another local
    user could otherwise swap a script that then runs as the runbook's user), then chmod 700."""
    checks = []
    for d in dirs:
        q = quote(d)
        checks.append(f"if [ -L {q} ]; then echo \"spark-runbook: {d} is a symlink; refusing to use it\" >&2; exit 1; "
                      f"fi; mkdir -p -- {q} && [ -d {q} ] || exit 1; "
                      f"if [ \"$(stat -c %u -- {q})\" != \"$(id -u)\" ]; then echo \"spark-runbook: {d} belongs to uid "
                      f"$(stat -c %u -- {q}), not to $(id -un); remove it or use another path\" >&2; exit 1; fi; "
                      f"chmod 700 -- {q} || exit 1")
    return "umask 077; " + "; ".join(checks)


def tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join((text or "").rstrip().splitlines()[-lines:])


@dataclass
class CommandResult:
    node: str
    command: str          # as run (may contain secrets; never logged as is)
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    dry_run: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


# a tool's progress line ends at \n or at the \r it redraws with (rsync --info=progress2, dd status=progress)
TOOL_LINE_BREAKS = r"\r\n|\r|\n"

class CommandLog:
    """Append-only JSONL log of every command run (secrets masked). Safe across threads;
    several processes (runner + notebook kernels) may append to the same file."""

    def __init__(self, path: Path | None, redactor: Redactor | None = None):
        self.path = Path(path) if path else None
        self.redactor = redactor or default_redactor()
        self._lock = threading.Lock()
        self.entries: list[dict[str, Any]] = []   # this process's entries (dry-run plans read it)

    def record(self, result: CommandResult, *, kind: str) -> dict[str, Any]:
        r = self.redactor.redact
        entry = {
            "time": time.time(),
            "node": result.node,
            "kind": kind,
            "command": r(result.command),
            "exit_code": result.exit_code,
            "duration_s": round(result.duration_s, 3),
            "dry_run": result.dry_run,
            "stdout_tail": r(tail(result.stdout)),
            "stderr_tail": r(tail(result.stderr)),
        }
        with self._lock:
            self.entries.append(entry)
            if self.path:
                append_line(self.path, json.dumps(entry))
        return entry


def append_line(path: Path, line: str) -> None:
    """Append one whole line: a single ``write`` on an ``O_APPEND`` descriptor, so lines of several processes never
    interleave and a kill leaves at most the last line missing, never half of it in the middle of the next one (a
    line a crash did tear is ended first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)        # the torn-line check and the write, together
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        os.write(fd, data)
    finally:
        os.close(fd)


@dataclass
class SshSettings:
    """How to reach nodes: from the profile's SSH_* keys."""
    ssh_config: Path | None = None
    key_file: Path | None = None
    known_hosts: Path | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0


class Node:
    """One node, described by a ``profile.NodeSpec`` (name, rank, ssh, fabric_ip, fabric_if,
    ib_devs, gid). Connects lazily; use as a context manager or call ``close()``."""

    def __init__(self, spec, ssh: SshSettings, *, log: CommandLog | None = None,
                 dry_run: bool = False, command_prefix: str = ""):
        self.spec = spec
        self.name = spec.name
        self.ssh = ssh
        self.log = log or CommandLog(None)
        self.dry_run = dry_run
        self.command_prefix = command_prefix     # rehearsal_path_prefix(profile); '' on real nodes
        self._conn = None
        self._conn_lock = threading.Lock()
        # one SFTP transfer at a time on the connection: fabric's lazily opened SFTP client, shared by every thread,
        # hung when three shares put files onto the head at once (bench_share, WEIGHT_TRANSPORT=stream)
        self._sftp_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Node({self.name!r}, ssh={self.spec.ssh!r})"

    # -- connection -------------------------------------------------------------------------
    def _connection(self):
        with self._conn_lock:
            if self._conn is None:
                self._conn = self._connect()
            return self._conn

    def _connect(self):
        from fabric import Config, Connection
        from paramiko import AutoAddPolicy, RejectPolicy

        overrides = {"run": {"in_stream": False}, "timeouts": {"connect": int(self.ssh.connect_timeout)}}
        if self.ssh.ssh_config:
            if not Path(self.ssh.ssh_config).is_file():
                raise RemoteError(f"ssh config {self.ssh.ssh_config} does not exist", node=self.name,
                                  fix="set SSH_CONFIG to an existing file (for the lab: make lab-up)")
            config = Config(runtime_ssh_path=str(self.ssh.ssh_config), overrides=overrides)
        else:
            config = Config(overrides=overrides)
        connect_kwargs: dict[str, Any] = {"allow_agent": False, "look_for_keys": self.ssh.key_file is None}
        if self.ssh.key_file:
            connect_kwargs["key_filename"] = str(self.ssh.key_file)
        conn = Connection(self.spec.ssh, config=config, connect_kwargs=connect_kwargs)
        # fabric accepts unknown host keys by default; we verify unless the profile allows new keys
        client = conn.client
        known_hosts = self.ssh.known_hosts or self._ssh_config_known_hosts(conn)
        if known_hosts and Path(known_hosts).exists():
            client.load_host_keys(str(known_hosts))
        else:
            client.load_system_host_keys()
        client.set_missing_host_key_policy(AutoAddPolicy() if self.ssh.accept_new_host_keys
                                           else RejectPolicy())
        try:
            conn.open()
        except Exception as exc:  # map paramiko/socket errors at the boundary
            raise map_connect_error(exc, self.name, self.spec.ssh, known_hosts) from exc
        return conn

    @staticmethod
    def _ssh_config_known_hosts(conn) -> str | None:
        value = conn.ssh_config.get("userknownhostsfile")
        return value.split()[0] if value else None

    def close(self) -> None:
        with self._conn_lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> "Node":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- commands ---------------------------------------------------------------------------
    def read(self, command: str, *, timeout: float = DEFAULT_READ_TIMEOUT,
             env: Mapping[str, str] | None = None) -> CommandResult:
        """Run a read-only probe. Executed even in dry-run; never raises on a non-zero exit."""
        return self._execute(command, timeout=timeout, env=env, kind="read", warn=True, lines=None)

    def run(self, command: str, *, timeout: float = DEFAULT_RUN_TIMEOUT, warn: bool = False,
            env: Mapping[str, str] | None = None, lines: Callable[[str], None] | None = None) -> CommandResult:
        """Run a command that changes the node. Dry-run records it without executing. ``lines``: each line of
        its stdout and stderr as it comes (``runbook.progress.relay``: a tool's counting lines), besides the
        result's."""
        if self.dry_run:
            result = CommandResult(self.name, self.command_prefix + _with_env(command, env), 0, dry_run=True)
            self.log.record(result, kind="run")
            return result
        return self._execute(command, timeout=timeout, env=env, kind="run", warn=warn, lines=lines)

    def _timed_out(self, conn, token: str, result: "CommandResult", timeout: float, kind: str, stdout: str,
                   stderr: str, cause: BaseException | None = None) -> None:
        """Record the call as exit 124, stop what it left on the node, raise the timeout's error."""
        result = dataclasses.replace(result, exit_code=124)
        self.log.record(result, kind=kind)
        killed = self._kill_call(conn, token)
        raise RemoteError(f"command timed out after {timeout:.0f} s ({killed})", node=self.name,
                          observed=self.log.redactor.redact(_summary(result.command, stdout, stderr)),
                          expected=f"completion within {timeout:.0f} s",
                          fix="check the node is responsive; raise the timeout only if the step "
                              "is known to be slow") from cause

    def _execute(self, command: str, *, timeout: float, env, kind: str, warn: bool,
                 lines: Callable[[str], None] | None) -> CommandResult:
        from invoke.exceptions import CommandTimedOut, UnexpectedExit

        import uuid

        conn = self._connection()
        full = self.command_prefix + _with_env(command, env)
        token = uuid.uuid4().hex               # marks this call's processes on the node (see _kill_call)
        started = time.monotonic()
        shown = {}
        if lines is not None:       # invoke writes what it echoes to these streams (runners.py ``_handle_output``)
            shown = {"out_stream": LineWriter(lines, TOOL_LINE_BREAKS),
                     "err_stream": LineWriter(lines, TOOL_LINE_BREAKS)}
        try:
            res = conn.run(f"export {CALL_MARKER}={token}; " + full, hide=lines is None, warn=True, timeout=timeout,
                           pty=False, in_stream=io.StringIO(_env_values(env)) if env else False, **shown)
            result = CommandResult(self.name, full, res.exited, res.stdout, res.stderr,
                                   time.monotonic() - started)
            if res.exited == -1 and result.duration_s >= timeout:
                # invoke's timer closed the channel but the run ended before it flagged the timeout (a race under
                # load): no exit status came back, so this is the timeout, not a command that exited -1
                self._timed_out(conn, token, result, timeout, kind, res.stdout, res.stderr)
        except CommandTimedOut as exc:
            out = exc.result
            result = CommandResult(self.name, full, 124, out.stdout, out.stderr,
                                   time.monotonic() - started)
            self._timed_out(conn, token, result, timeout, kind, out.stdout, out.stderr, cause=exc)
        except UnexpectedExit as exc:  # warn=True makes this rare, but keep the mapping total
            out = exc.result
            result = CommandResult(self.name, full, out.exited, out.stdout, out.stderr,
                                   time.monotonic() - started)
        except (OSError, EOFError, socket.error) as exc:
            self._conn = None
            raise RemoteError(f"connection to {self.spec.ssh} lost: {exc}", node=self.name,
                              fix="check the node is up and sshd is running") from exc
        finally:
            for each in shown.values():
                each.close()                # a last line without its newline
        self.log.record(result, kind=kind)
        if not result.ok and not warn:
            redact = self.log.redactor.redact
            raise RemoteError(f"command failed with exit code {result.exit_code}", node=self.name,
                              observed=redact(_summary(full, result.stdout, result.stderr)),
                              expected="exit code 0")
        return result

    def _kill_call(self, conn, token: str) -> str:
        """Kill what a timed-out call left on the node. Closing the channel (fabric's timeout) stops nothing there:
        without a pty sshd sends no signal, so the command ran on (found on a real sshd: ``sleep 30`` outlived its
        2 s timeout). Its processes carry ``CALL_MARKER=token`` in their environment; each is killed with its
        process group (the shell that runs it). Returns what was done, for the error."""
        command, started = _kill_call_command(token), time.monotonic()
        try:
            res = conn.run(command, hide=True, warn=True, timeout=15, pty=False, in_stream=False)
        except Exception as exc:  # noqa: BLE001 - the timeout is the error to report; this is its aftermath
            return f"its processes on the node could not be stopped: {type(exc).__name__}: {exc}"
        self.log.record(CommandResult(self.name, command, res.exited, res.stdout, res.stderr,
                                      time.monotonic() - started), kind="run")
        pids = res.stdout.split()
        return f"its {len(pids)} process(es) on the node were killed" if pids else "nothing of it was left running"

    def put(self, local: str | Path, remote: str) -> None:
        if self.dry_run:
            self.log.record(CommandResult(self.name, f"put {local} -> {remote}", 0, dry_run=True), kind="run")
            return
        started = time.monotonic()
        conn = self._connection()
        with self._sftp_lock:
            conn.put(str(local), remote)
        self.log.record(CommandResult(self.name, f"put {local} -> {remote}", 0,
                                      duration_s=time.monotonic() - started), kind="run")

    def get(self, remote: str, local: str | Path) -> None:
        started = time.monotonic()
        conn = self._connection()
        with self._sftp_lock:
            conn.get(remote, str(local))
        self.log.record(CommandResult(self.name, f"get {remote} -> {local}", 0,
                                      duration_s=time.monotonic() - started), kind="read")


OFFLINE_NOTE = "offline review: not run"


class OfflineNode(Node):
    """A node the runbook never connects to (the offline review, ``python -m runbook render``): every change is
    recorded as in a dry run; a read is answered from declared ``facts`` (exact command -> stdout, e.g. the
    node's $HOME) and otherwise recorded and answered as unknown (exit 1, no output). Opening a connection
    raises, so nothing can reach a network."""

    def __init__(self, spec, *, facts: Mapping[str, str], log: CommandLog, command_prefix: str = ""):
        super().__init__(spec, SshSettings(), log=log, dry_run=True, command_prefix=command_prefix)
        self.facts = dict(facts)

    def _connect(self):
        raise RemoteError("offline review: this node is never connected to", node=self.name,
                          fix="run the step for real (python -m runbook run) to reach the node")

    def read(self, command: str, *, timeout: float = DEFAULT_READ_TIMEOUT,
             env: Mapping[str, str] | None = None) -> CommandResult:
        full = self.command_prefix + _with_env(command, env)
        if command in self.facts:
            result = CommandResult(self.name, full, 0, self.facts[command], dry_run=True)
        else:
            result = CommandResult(self.name, full, 1, "", OFFLINE_NOTE, dry_run=True)
        self.log.record(result, kind="read")
        return result

    def get(self, remote: str, local: str | Path) -> None:
        self.log.record(CommandResult(self.name, f"get {remote} -> {local}", 1, "", OFFLINE_NOTE, dry_run=True),
                        kind="read")
        raise RemoteError(f"offline review: {remote} cannot be fetched", node=self.name)


#: the cluster lock: a directory in the head's home (the SSH user's), made with mkdir (atomic), holding owner.json
LOCK_NAME = ".spark-runbook.lock"
LOCK_TIMEOUT = 30


def _process_start(pid: int) -> str:
    """A process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22): tells a pid that was
    reused from the one that took a lock. "" when unknown."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _pid_alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass                               # another user's process: alive
    return not start or _process_start(pid) in ("", start)


class ClusterLock:
    """One run per cluster: ``run``, ``start``, ``stop`` and ``diagnose`` hold a lock on the head (``~/LOCK_NAME``,
    with pid, host, user, command and start time; never taken in a dry run, which changes nothing). A second
    caller gets :class:`BusyError` (exit 9) naming the holder; a lock whose holder is a dead process of this
    machine is said to be stale and taken over.

        with ClusterLock(cluster.head, command="start"):
            ...
    """

    def __init__(self, node: "Node", *, command: str, run_id: str = "", timeout: float = LOCK_TIMEOUT,
                 echo: Callable[[str], None] = lambda line: None):
        self.node, self.command, self.run_id, self.timeout, self.echo = node, command, run_id, timeout, echo
        self.token = ""
        self._own_cluster: "Cluster | None" = None
        self._owner_record: dict[str, Any] = {}
        self.ssh_line = f"ssh {shlex.quote(node.spec.ssh)}"     # how a person reaches the head (for_profile: exact)

    @classmethod
    def for_profile(cls, profile, *, command: str, echo: Callable[[str], None] = lambda line: None) -> "ClusterLock":
        """Take the lock on the profile's head over a connection of its own (closed on release)."""
        cluster = Cluster.from_profile(profile)
        lock = cls(cluster.head, command=command, echo=echo)
        lock.ssh_line = operator_ssh(profile, cluster.head.name)
        lock._own_cluster = cluster
        try:
            return lock.acquire()
        except BaseException:
            cluster.close()
            raise

    def _owner(self) -> dict[str, Any]:
        import datetime as _dt
        import getpass
        return {"pid": os.getpid(), "pid_start": _process_start(os.getpid()), "host": socket.gethostname(),
                "user": getpass.getuser(), "command": self.command, "run": self.run_id,
                "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "token": self.token}

    def _try(self) -> dict[str, Any] | None:
        """Take the lock (None) or return what the holder wrote ({} when it wrote nothing yet)."""
        self._owner_record = self._owner()
        owner = json.dumps(self._owner_record)
        res = self.node.run(f'd="$HOME"/{LOCK_NAME}; if mkdir -m 700 "$d" 2>/dev/null; then '
                            f'printf "%s\\n" {shlex.quote(owner)} > "$d/owner.json" && echo ACQUIRED; '
                            f'else echo HELD; cat "$d/owner.json" 2>/dev/null; fi', timeout=self.timeout, warn=True)
        lines = res.stdout.strip().splitlines()
        if res.ok and lines and lines[0] == "ACQUIRED":
            return None
        if not lines or lines[0] != "HELD":
            raise RemoteError("cannot take the cluster lock on the head", node=self.node.name,
                              observed=f"exit {res.exit_code}: {(res.stderr or res.stdout).strip()[-300:]}",
                              expected=f"mkdir ~/{LOCK_NAME} answers", fix="check the head's home is writable")
        try:
            return json.loads("\n".join(lines[1:]) or "{}")
        except ValueError:
            return {}

    def acquire(self) -> "ClusterLock":
        import uuid
        self.token = uuid.uuid4().hex
        holder = self._try()
        if holder is None:
            return self
        stale = (holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int)
                 and not _pid_alive(holder["pid"], str(holder.get("pid_start") or "")))
        if stale:
            self.echo(f"cluster lock: stale lock of pid {holder['pid']} ({holder.get('command', '?')} since "
                      f"{holder.get('started', '?')}) on {holder.get('host')}: that process is gone; taking it over")
            self.node.run(f'd="$HOME"/{LOCK_NAME}; grep -qF {shlex.quote(str(holder.get("token", "")))} '
                          f'"$d/owner.json" 2>/dev/null && rm -rf -- "$d"', timeout=self.timeout, warn=True)
            holder = self._try()
            if holder is None:
                return self
        who = (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} (user {holder.get('user', '?')}): "
               f"`{holder.get('command', '?')}`" + (f" of run {holder['run']}" if holder.get("run") else "") +
               f" since {holder.get('started', '?')}") if holder else "a caller that has not written its owner file yet"
        raise BusyError(f"the cluster is in use: another run holds the lock on {self.node.name}",
                        node=self.node.name, observed=f"~/{LOCK_NAME} held by {who}",
                        expected="one run, start, stop or diagnose at a time on these nodes",
                        fix=f"wait for it to end; if that process is gone (another machine, a reboot), remove the "
                            f"lock: {self.ssh_line} rm -rf ~/{LOCK_NAME}")

    def name_run(self, run_id: str) -> None:
        """Write the run folder into the held lock's owner file once it exists (a second caller's refusal then
        names the run, not only a pid)."""
        self.run_id = run_id
        if not self.token:
            return
        owner = json.dumps({**self._owner_record, "run": run_id})
        self.node.run(f'd="$HOME"/{LOCK_NAME}; grep -qF {shlex.quote(self.token)} "$d/owner.json" 2>/dev/null && '
                      f'printf "%s\\n" {shlex.quote(owner)} > "$d/owner.json.tmp" && mv -f "$d/owner.json.tmp" '
                      f'"$d/owner.json"', timeout=self.timeout, warn=True)

    def release(self) -> None:
        if not self.token:
            return
        try:
            self.node.run(f'd="$HOME"/{LOCK_NAME}; grep -qF {shlex.quote(self.token)} "$d/owner.json" 2>/dev/null '
                          f'&& rm -rf -- "$d"', timeout=self.timeout, warn=True)
        except RunbookError as err:           # never hides the caller's own outcome; the next caller sees it stale
            self.echo(f"cluster lock: could not release ~/{LOCK_NAME} on {self.node.name}: {err.what}")
        self.token = ""
        if self._own_cluster is not None:
            self._own_cluster.close()
            self._own_cluster = None

    def __enter__(self) -> "ClusterLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class Cluster:
    """Head and worker(s), ordered by rank."""

    def __init__(self, nodes: Iterable[Node], *, log: CommandLog):
        self.nodes = sorted(nodes, key=lambda n: n.spec.rank)
        self.log = log

    @property
    def dry_run(self) -> bool:
        """Every node records its changes instead of running them (``--dry-run``, the offline review)."""
        return bool(self.nodes) and all(n.dry_run for n in self.nodes)

    @classmethod
    def from_profile(cls, profile, *, run_dir: Path | None = None, dry_run: bool = False,
                     redactor: Redactor | None = None) -> "Cluster":
        log = CommandLog(Path(run_dir) / "commands.jsonl" if run_dir else None, redactor)
        settings = ssh_settings(profile)
        prefix = rehearsal_path_prefix(profile)
        return cls([Node(spec, settings, log=log, dry_run=dry_run, command_prefix=prefix) for spec in profile.nodes],
                   log=log)

    @classmethod
    def offline(cls, profile, *, facts: Mapping[str, Mapping[str, str]], log: CommandLog) -> "Cluster":
        """The profile's nodes as :class:`OfflineNode` s, each knowing only its declared facts (node -> command ->
        stdout)."""
        prefix = rehearsal_path_prefix(profile)
        return cls([OfflineNode(spec, facts=facts.get(spec.name, {}), log=log, command_prefix=prefix)
                    for spec in profile.nodes], log=log)

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def worker(self) -> Node:
        return self.nodes[1]

    @property
    def workers(self) -> list[Node]:
        return self.nodes[1:]

    def __getitem__(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def __iter__(self):
        return iter(self.nodes)

    def each(self, fn: Callable[[Node], T], nodes: Iterable[Node] | None = None) -> dict[str, T | Exception]:
        """Call ``fn(node)`` on every node in parallel; a failure on one node is returned as its
        exception and never hides the other nodes' answers."""
        targets = list(nodes) if nodes is not None else self.nodes
        out: dict[str, T | Exception] = {}
        with ThreadPoolExecutor(max_workers=max(1, len(targets))) as pool:
            futures = {node.name: pool.submit(fn, node) for node in targets}
            for name, future in futures.items():
                try:
                    out[name] = future.result()
                except Exception as exc:  # noqa: BLE001 - returned to the caller per node
                    out[name] = exc
        return out

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def ssh_settings(profile) -> SshSettings:
    def path_or_none(value: str) -> Path | None:
        return profile.resolve_path(value) if value else None
    return SshSettings(
        ssh_config=path_or_none(profile.ssh_config),
        key_file=path_or_none(profile.ssh_key),
        known_hosts=path_or_none(profile.known_hosts),
        accept_new_host_keys=bool(profile.ssh_accept_new_host_keys),
        connect_timeout=float(profile.ssh_connect_timeout),
    )


def ssh_host_config(target: str, ssh_config: str | Path | None) -> dict[str, Any]:
    """What an ssh target (``[user@]alias[:port]``) resolves to in the ssh config, read by paramiko's
    ``SSHConfig`` (the parser fabric connects with: Host patterns and wildcards, Match): ``hostname`` (the
    alias itself when no block names one), and ``user``, ``port``, ``identityfile`` where the config sets them.
    No config file: the target's own host part."""
    host = target.split("@", 1)[-1].split(":", 1)[0]
    if not ssh_config or not Path(ssh_config).is_file():
        return {"hostname": host}
    from paramiko import SSHConfig
    return dict(SSHConfig.from_path(str(ssh_config)).lookup(host))


def map_connect_error(exc: Exception, node: str, target: str, known_hosts) -> RemoteError:
    """Turn paramiko/socket exceptions into a RemoteError with a fix."""
    from paramiko.ssh_exception import (AuthenticationException, BadHostKeyException,
                                        NoValidConnectionsError, SSHException)
    text = str(exc) or type(exc).__name__
    if isinstance(exc, BadHostKeyException):
        return RemoteError(f"host key of {target} does not match {known_hosts}", node=node,
                           observed=text, expected="the recorded host key",
                           fix="if the node was reinstalled, remove its old line from known_hosts "
                               "(ssh-keygen -R HOST -f FILE) and verify the new key out of band")
    if isinstance(exc, AuthenticationException):
        return RemoteError(f"SSH key authentication to {target} failed", node=node, observed=text,
                           fix="install the runbook's public key in the node's authorized_keys "
                               "(ssh-copy-id) and set SSH_KEY")
    if isinstance(exc, SSHException) and "not found in known_hosts" in text:
        return RemoteError(f"host key of {target} is not in {known_hosts or '~/.ssh/known_hosts'}",
                           node=node, observed=text, expected="a known host key",
                           fix=f"verify the node's key and add it: ssh-keyscan HOST >> "
                               f"{known_hosts or '~/.ssh/known_hosts'}")
    if isinstance(exc, (NoValidConnectionsError, socket.timeout, TimeoutError, ConnectionError, OSError)):
        return RemoteError(f"cannot connect to {target}: {text}", node=node,
                           fix="check the address in HEAD_SSH/WORKER_SSH (or the ssh_config alias), "
                               "that sshd runs, and that the network path is up (lab: make lab-up)")
    return RemoteError(f"SSH to {target} failed: {text}", node=node)


#: environment variable that marks every process of one remote call (inherited by its children, never on a command
#: line), so a call that timed out can be killed on the node
CALL_MARKER = "SPARK_RUNBOOK_CALL"


def _kill_call_command(token: str) -> str:
    """Shell that SIGKILLs every process whose environment holds ``CALL_MARKER=token``, and its process group, and
    prints their pids. It runs in its own ssh session: its own processes do not carry the marker."""
    return (f'for d in /proc/[0-9]*; do grep -qsxzF {CALL_MARKER}={token} "$d/environ" || continue; '
            f'p=${{d#/proc/}}; g=$(sed "s/.*) //" "$d/stat" 2>/dev/null | cut -d" " -f3); '
            f'kill -KILL -- "$p" ${{g:+"-$g"}} 2>/dev/null; echo "$p"; done; true')


def _with_env(command: str, env: Mapping[str, str] | None) -> str:
    """Environment for one command, read from the command's stdin (``_env_values``), never written into
    the command line: a value on the remote shell's command line is readable by anyone in ``ps`` on the
    node while the command runs (the API key during a docker start)."""
    if not env:
        return command
    reads = " && ".join(f"IFS= read -r {k}" for k in env)
    return f"{reads} && export {' '.join(env)}; {command}"


def _env_values(env: Mapping[str, str]) -> str:
    for key, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) or "\n" in str(value):
            raise ValueError(f"environment {key!r}: a name of letters, digits and _, a value of one line")
    return "".join(f"{value}\n" for value in env.values())


def _summary(command: str, stdout: str, stderr: str) -> str:
    parts = [f"$ {command}"]
    if stdout.strip():
        parts.append("stdout (tail):\n" + tail(stdout))
    if stderr.strip():
        parts.append("stderr (tail):\n" + tail(stderr))
    return "\n".join(parts)


def node_ssh_argv(profile, node: "Node", target_ip: str) -> list[str]:
    """ssh from one node to another over the fabric. The lab's nodes share the host's
    filesystem, so its key and known_hosts are passed explicitly; real Sparks use the
    node user's own ~/.ssh."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "StrictHostKeyChecking=yes"]
    if profile.is_lab:
        if profile.ssh_key:
            argv += ["-i", str(profile.resolve_path(profile.ssh_key))]
        if profile.known_hosts:
            argv += ["-o", f"UserKnownHostsFile={profile.resolve_path(profile.known_hosts)}"]
    user = node.spec.ssh.split("@", 1)[0] + "@" if "@" in node.spec.ssh else ("root@" if profile.is_lab else "")
    return argv + [f"{user}{target_ip}"]


def operator_ssh(profile, node: str) -> str:
    """The ssh command a person types to reach one node of ``profile`` (for fixes: ``kill -CONT`` on a frozen
    rank, a lock's owner), with the profile's config, key and known_hosts, paths as the profile spells them."""
    spec = next((n for n in profile.nodes if n.name == node), None)
    if spec is None:
        raise RunbookError(f"no node {node!r} in profile {profile.profile_name}",
                           fix=f"one of: {', '.join(n.name for n in profile.nodes)}")
    argv = ["ssh"]
    if profile.ssh_config:
        argv += ["-F", str(profile.ssh_config)]
    if profile.ssh_key:
        argv += ["-i", str(profile.ssh_key)]
    if profile.known_hosts:
        argv += ["-o", f"UserKnownHostsFile={profile.known_hosts}"]
    return " ".join(shlex.quote(a) for a in argv + [spec.ssh])


def expand_home(path: str, home: str, *, key: str = "path") -> str:
    """The one expansion of a node path (every step uses it): ``~`` and ``~/x`` -> ``home``/x; absolute paths unchanged. ``~user/…`` and relative paths are
    refused (naming ``key``): a remote node has no meaningful working directory.

    >>> expand_home("~/.cache/huggingface", "/home/spark")
    '/home/spark/.cache/huggingface'
    """
    path = str(path)
    if path == "~":
        return home
    if path.startswith("~/"):
        return posixpath.join(home, path[2:])
    if path.startswith("~"):
        raise RunbookError(f"{key} uses another user's home", observed=path, expected="~/… or an absolute path",
                           fix=f"write {key} as ~/… (the SSH user's home on each node) or as an absolute path")
    if not posixpath.isabs(path):
        raise RunbookError(f"{key} is a relative path", observed=path, expected="~/… or an absolute path",
                           fix=f"write {key} as ~/… or as an absolute path")
    return path


# ------------------------------------------------------------------------------------------------
# SSH local forward: reach an address only a node can reach (its loopback, its fabric IP)
# ------------------------------------------------------------------------------------------------

def forward_ssh_argv(ssh: SshSettings, target: str, local_port: int, remote_host: str, remote_port: int) -> list[str]:
    """OpenSSH argv of a local forward ``127.0.0.1:local_port -> remote_host:remote_port`` as seen from
    ``target``, with the same config, key and host-key policy as the fabric connections."""
    argv = ["ssh", "-N", "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes", "-o", "ControlPath=none",
            "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3",
            "-o", f"ConnectTimeout={max(1, int(ssh.connect_timeout))}",
            "-o", f"StrictHostKeyChecking={'accept-new' if ssh.accept_new_host_keys else 'yes'}"]
    if ssh.ssh_config:
        argv += ["-F", str(ssh.ssh_config)]
    if ssh.key_file:
        argv += ["-i", str(ssh.key_file), "-o", "IdentitiesOnly=yes"]
    if ssh.known_hosts:
        argv += ["-o", f"UserKnownHostsFile={ssh.known_hosts}"]
    return argv + ["-L", f"127.0.0.1:{int(local_port)}:{remote_host}:{int(remote_port)}", target]


# sh keeps ssh's pid, ends when ssh ends (so poll() tells the forward is gone), and kills ssh when the
# runbook process goes away for any reason: its stdin pipe then reads EOF.
# (A background list's stdin is /dev/null in a shell without job control: the pipe is kept on fd 3.)
_FORWARD_WRAPPER = ('ssh_log=$1; shift; exec 3<&0; "$@" </dev/null 2>"$ssh_log" & pid=$!; '
                    '(read _ <&3; kill $pid 2>/dev/null) & wait $pid')


class LocalForward:
    """An SSH local forward to ``remote_host:remote_port`` as seen from node ``target`` (an ssh alias or
    user@host). OpenSSH runs it in its own process, so forwarded bytes never compete with the caller's
    Python threads (the bench's timed reader). ``open()`` returns once the local port accepts."""

    def __init__(self, target: str, ssh: SshSettings, remote_host: str, remote_port: int, *, node: str = "head"):
        self.target, self.ssh, self.node = target, ssh, node
        self.remote_host, self.remote_port = remote_host, int(remote_port)
        self.local_port = 0
        self._proc = None
        self._log_path: Path | None = None

    @property
    def url_host(self) -> str:
        return f"127.0.0.1:{self.local_port}"

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def open(self, *, attempts: int = 3) -> "LocalForward":
        import subprocess
        import tempfile

        last = ""
        for _ in range(attempts):      # a free port can be taken between the probe and ssh's bind
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.local_port = s.getsockname()[1]
            fd, log = tempfile.mkstemp(prefix="spark-runbook-forward-", suffix=".log")
            os.close(fd)
            self._log_path = Path(log)
            argv = forward_ssh_argv(self.ssh, self.target, self.local_port, self.remote_host, self.remote_port)
            self._proc = subprocess.Popen(["sh", "-c", _FORWARD_WRAPPER, "sh", log, *argv],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + self.ssh.connect_timeout + 10
            while time.monotonic() < deadline and self.alive():
                try:
                    with socket.create_connection(("127.0.0.1", self.local_port), timeout=0.5):
                        return self
                except OSError:
                    time.sleep(0.1)
            last = tail(self._log_path.read_text(errors="replace")) if self._log_path.exists() else ""
            self.close()
            if last and "forwarding" not in last.lower():
                break                  # ssh itself failed (auth, host key, unreachable): no point retrying
        raise RemoteError(f"could not open an SSH forward to {self.remote_host}:{self.remote_port} on "
                          f"{self.target}", node=self.node, observed=last or "the forward never listened",
                          fix=f"check `ssh {self.target}` works from this machine with the profile's SSH_* keys; "
                              f"or set API_HOST=0.0.0.0 (with VLLM_API_KEY) to reach the API directly")

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.stdin.close()             # the wrapper kills ssh on EOF
                proc.wait(timeout=5)
            except Exception:  # noqa: BLE001 - best effort: the process group goes too
                try:
                    os.killpg(proc.pid, 9)
                except OSError:
                    pass
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None
