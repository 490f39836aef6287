"""The test doubles of the remote layer, in one place (issue 12): ``FakeNode``, ``LocalNode``, ``FakeCluster``.

* ``FakeNode`` has ``runbook.remote.Node``'s surface (``read``/``run``/``put``/``get``, ``name``, ``spec``,
  ``dry_run``) and answers from ``rules``; a command no rule matches fails the test with the node and the
  command named. It never invents an answer.
* ``LocalNode`` is a FakeNode whose commands run for real in a local bash (own HOME / cwd / environment,
  node paths mapped to a temporary directory): the answers are the real tools' output.
* ``FakeCluster`` *is* ``runbook.remote.Cluster`` (same ``head``/``worker``/``workers``/``[name]``/``each``,
  per-node results or exceptions from a thread pool) over doubles.

    head = FakeNode("head", 0, rules=[(exact("ip -j route show"), "[]"), (r"^ping ", res(1, "", "unreachable"))])
    cluster = FakeCluster([head, LocalNode("worker", 1, home=tmp_path / "w")])

The vLLM double (``FakeVllm``) lives next door in ``support.fake_vllm``.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from runbook.errors import RemoteError
from runbook.facts import ranks
from runbook.profile import NodeSpec
from runbook.remote import DEFAULT_READ_TIMEOUT, DEFAULT_RUN_TIMEOUT, Cluster, CommandLog, CommandResult

__all__ = ["FakeNode", "LocalNode", "LocalShell", "FakeCluster", "Call", "NoLock", "SHELL", "exact", "res", "local_pair"]

#: a rule's answer meaning "run this command for real in the node's LocalShell"
SHELL = "<run in the node's local shell>"
ANY = re.compile("")


def exact(command: str) -> re.Pattern:
    """A rule pattern matching this whole command and nothing else."""
    return re.compile("^" + re.escape(command) + r"\Z")


def res(exit_code: int = 0, stdout: str = "", stderr: str = "") -> CommandResult:
    """A canned answer; the node fills in its name and the command asked."""
    return CommandResult("", "", exit_code, stdout, stderr)


@dataclasses.dataclass
class LocalShell:
    """Runs a node's command in a local ``bash -c``, the way sshd would on the node.

    ``env`` is the whole environment (default: this process's); ``HOME`` is ``home`` when given;
    ``path_first`` is put in front of PATH; ``as_user=(uid, gid)`` runs it as that user (setpriv);
    ``rewrite`` maps node paths to local ones in commands and file copies (and back in the output);
    ``prefix`` is prepended to every command (the rehearsal PATH hook)."""
    home: Path | None = None
    cwd: Path | None = None
    env: Mapping[str, str] | None = None
    path_first: tuple = ()
    as_user: tuple[int, int] | None = None
    rewrite: Mapping[str, str] = dataclasses.field(default_factory=dict)
    prefix: str = ""

    def local_path(self, path: str) -> str:
        for node_path, local in self.rewrite.items():
            path = path.replace(node_path, local)
        return path

    def node_text(self, text: str) -> str:
        for node_path, local in self.rewrite.items():
            text = text.replace(local, node_path)
        return text

    def __call__(self, node: str, command: str, *, timeout: float, env: Mapping[str, str] | None = None
                 ) -> CommandResult:
        base = dict(self.env if self.env is not None else os.environ)
        if self.home is not None:
            base["HOME"] = str(self.home)
        if self.path_first:
            base["PATH"] = os.pathsep.join([*map(str, self.path_first), base.get("PATH", "/usr/bin:/bin")])
        base.update(env or {})
        argv = ["bash", "-c", self.local_path(self.prefix + command)]
        if self.as_user:
            uid, gid = self.as_user
            argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *argv]
        started = time.monotonic()
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=base,
                               cwd=self.cwd)
        except subprocess.TimeoutExpired as exc:     # what Node raises on a timeout
            raise RemoteError(f"command timed out after {timeout:.0f} s", node=node, observed=command,
                              expected=f"completion within {timeout:.0f} s") from exc
        return CommandResult(node, command, p.returncode, self.node_text(p.stdout), self.node_text(p.stderr),
                             time.monotonic() - started)


class Call(NamedTuple):
    kind: str                     # "read" or "run" (put/get are logged like Node's log: run/read)
    command: str
    timeout: float | None = None
    warn: bool = False
    env: Mapping[str, str] | None = None


Answer = Any    # CommandResult | str (stdout, exit 0) | BaseException (raised) | SHELL | callable(command) -> Answer


class FakeNode:
    """``runbook.remote.Node`` with canned answers.

    ``rules``: ``[(pattern, answer), ...]``, first match wins (a third element ``"read"``/``"run"`` limits a rule
    to that kind of call); ``pattern`` is a regex searched in the command
    (``exact(cmd)`` for the whole command); ``answer`` is a ``CommandResult`` (:func:`res`), a str (stdout,
    exit 0), an exception (raised, like a lost connection), :data:`SHELL` (run it in ``shell``) or a callable
    ``(command) -> answer``. ``rules`` is a plain list: tests may insert/append/replace rules.

    A command no rule matches raises ``AssertionError`` naming the node and the command. ``read_only=True``
    refuses every ``run``/``put`` (the step under test must not change nodes). ``run`` keeps Node's contract:
    a non-zero exit raises ``RemoteError`` unless ``warn``; in dry-run it is recorded and not executed.
    Every call is recorded in ``calls`` as a :class:`Call` (kind, command, timeout, warn, env)."""

    def __init__(self, name: str = "head", rank: int = 0, *, rules: Iterable[tuple[Any, Answer]] = (),
                 read_only: bool = False, dry_run: bool = False, shell: LocalShell | None = None,
                 spec: NodeSpec | None = None, **spec_fields):
        if spec is None:
            spec_fields.setdefault("ssh", f"root@{name}")
            spec_fields.setdefault("fabric_ip", f"10.0.0.{rank + 1}")
            spec_fields.setdefault("fabric_if", "enp1s0f0np0")
            spec = NodeSpec(name=name, rank=rank, **spec_fields)
        elif spec_fields:
            raise TypeError(f"FakeNode: give either spec= or spec fields, not both ({sorted(spec_fields)})")
        self.spec, self.name = spec, spec.name
        self.rules: list[tuple[Any, Answer]] = list(rules)
        self.read_only, self.dry_run, self.shell = read_only, dry_run, shell
        self.command_prefix = ""
        self.log = CommandLog(None)                 # the real log: secrets masked like on a node
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # -- what the test reads back ---------------------------------------------------------------
    @property
    def commands(self) -> list[str]:
        """Every command asked, in order (reads, runs, puts and gets)."""
        return [c.command for c in self.calls]

    def reads(self) -> list[str]:
        return [c.command for c in self.calls if c.kind == "read"]

    def runs(self) -> list[str]:
        """Every command that changes the node (runs and puts), in order."""
        return [c.command for c in self.calls if c.kind == "run"]

    # -- Node's surface -------------------------------------------------------------------------
    def read(self, command: str, *, timeout: float = DEFAULT_READ_TIMEOUT,
             env: Mapping[str, str] | None = None) -> CommandResult:
        return self._answer(Call("read", command, timeout, True, env))

    def run(self, command: str, *, timeout: float = DEFAULT_RUN_TIMEOUT, warn: bool = False,
            env: Mapping[str, str] | None = None, lines: Callable[[str], None] | None = None) -> CommandResult:
        if self.read_only:
            raise AssertionError(f"{self!r} is read-only: the step must not change nodes, asked to run: {command[:300]}")
        if self.dry_run:
            self._record(Call("run", command, timeout, warn, env))
            result = CommandResult(self.name, command, 0, dry_run=True)
            self.log.record(result, kind="run")
            return result
        result = self._answer(Call("run", command, timeout, warn, env))
        if lines is not None:              # as remote.Node: each line of both streams, besides the result
            for line in (result.stdout + result.stderr).splitlines():
                lines(line)
        if not result.ok and not warn:
            raise RemoteError(f"command failed with exit code {result.exit_code}", node=self.name,
                              observed=f"$ {command}\n{result.stderr}", expected="exit code 0")
        return result

    def put(self, local: str | Path, remote: str) -> None:
        if self.read_only:
            raise AssertionError(f"{self!r} is read-only: the step must not copy files to it ({local} -> {remote})")
        self._record(Call("run", f"put {local} -> {remote}"))
        if self.dry_run:
            return
        if self.shell is None:
            raise AssertionError(f"{self!r} has no local shell to put {local} -> {remote} into; use LocalNode")
        shutil.copyfile(local, self.shell.local_path(remote))

    def get(self, remote: str, local: str | Path) -> None:
        self._record(Call("read", f"get {remote} -> {local}"))
        if self.shell is None:
            raise AssertionError(f"{self!r} has no local shell to get {remote} from; use LocalNode")
        shutil.copyfile(self.shell.local_path(remote), local)

    def close(self) -> None:
        pass

    def __enter__(self) -> "FakeNode":
        return self

    def __exit__(self, *exc) -> None:
        pass

    # -- answering ------------------------------------------------------------------------------
    def _record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)

    def _answer(self, call: Call) -> CommandResult:
        kind, command, timeout, env = call.kind, call.command, call.timeout, call.env
        assert timeout and timeout > 0, f"{self!r}: command without a positive timeout: {command[:200]}"
        self._record(call)
        answer: Answer = None
        for pattern, candidate, *only in list(self.rules):
            if (not only or only[0] == kind) and re.search(pattern, command):
                answer = candidate
                break
        else:
            raise AssertionError(f"{self!r} refused unknown command ({kind}): {command[:300]}")
        while callable(answer):
            answer = answer(command)
        if isinstance(answer, BaseException):
            raise answer
        if answer is SHELL:
            if self.shell is None:
                raise AssertionError(f"{self!r}: a rule says SHELL but the node has no shell")
            result = self.shell(self.name, command, timeout=timeout, env=env)
        elif isinstance(answer, str):
            result = CommandResult(self.name, command, 0, answer)
        elif isinstance(answer, CommandResult):
            result = dataclasses.replace(answer, node=self.name, command=command)
        else:
            raise TypeError(f"{self!r}: a rule answered {answer!r} for {command[:200]}; expected a CommandResult, "
                            "str, exception, SHELL or callable")
        self.log.record(result, kind=kind)
        return result


class LocalNode(FakeNode):
    """A node that is a local bash: every command (after any canned ``rules``) runs for real.

    ``home``: the node's HOME (created); ``cwd``: its working directory (default: a sibling of home, so a
    command that forgets ``~`` lands somewhere the test can look); ``env``, ``path_first``, ``as_user``,
    ``rewrite``, ``prefix``: see :class:`LocalShell`."""

    def __init__(self, name: str = "head", rank: int = 0, *, home: str | Path | None = None,
                 cwd: str | Path | None = None, env: Mapping[str, str] | None = None, path_first: Iterable = (),
                 as_user: tuple[int, int] | None = None, rewrite: Mapping[str, str] | None = None, prefix: str = "",
                 rules: Iterable[tuple[Any, Answer]] = (), **kw):
        if home is not None:
            home = Path(home)
            home.mkdir(parents=True, exist_ok=True)
            if cwd is None:
                cwd = home.parent / f"{name}-cwd"
        if cwd is not None:
            Path(cwd).mkdir(parents=True, exist_ok=True)
        self.home = home
        self.cwd = Path(cwd) if cwd is not None else None
        shell = LocalShell(home=home, cwd=self.cwd, env=env, path_first=tuple(path_first), as_user=as_user,
                           rewrite=dict(rewrite or {}), prefix=prefix)
        super().__init__(name, rank, rules=[*rules, (ANY, SHELL)], shell=shell, **kw)


def local_pair(tmp_path: Path, **kw) -> tuple[LocalNode, LocalNode]:
    """head (10.77.0.1) and worker (10.77.0.2) as local shells, each with its own HOME (a path with a space, to
    catch quoting) and working directory, and a clean environment whose PATH starts with this interpreter's
    bin (the nodes' python3 has the runbook's dependencies). ``kw``: more LocalNode options."""
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]),
           "LANG": "C.UTF-8"}
    head = LocalNode("head", 0, home=tmp_path / "head home", fabric_ip="10.77.0.1", env=env, **kw)
    worker = LocalNode("worker", 1, home=tmp_path / "worker home", fabric_ip="10.77.0.2", env=env, **kw)
    return head, worker


class FakeCluster(Cluster):
    """``runbook.remote.Cluster`` over doubles: the real head/worker/workers/[name]/each (thread pool,
    an exception per failed node)."""

    def __init__(self, nodes: Iterable[FakeNode]):
        super().__init__(list(nodes), log=CommandLog(None))


def rank_node(name: str, rank: int, *, pid: str | int = "", fingerprint: str = "", ps: str = "") -> FakeNode:
    """A read-only node that answers only what ``ranks.rank_state`` reads: ``$HOME`` and the one command with the
    rank's pid file, its start record's fingerprint and the process table (``ps``: lines of ``ranks.PS_CMD``)."""
    answer = f"{pid}\n@@\n{fingerprint}\n@@\n\n@@\n\n@@\n{ps}"
    return FakeNode(name, rank, read_only=True, rules=[
        (r'^printf %s "\$HOME"$', "/root"),
        (rf"^cat \S+/{name}\.pid 2>/dev/null; .*" + re.escape(ranks.PS_CMD) + "$", answer)])


class NoLock:
    """Stands in for ``runbook.remote.ClusterLock`` where a test is about something else (the lock has its own
    tests): takes nothing on any node, so a unit test never contends with a lab run for the real head's lock."""

    def __init__(self, *args, **kwargs):
        pass

    @classmethod
    def for_profile(cls, *args, **kwargs) -> "NoLock":
        return cls()

    def release(self) -> None:
        pass

    def name_run(self, run_id: str) -> None:
        pass

    def __enter__(self) -> "NoLock":
        return self

    def __exit__(self, *exc) -> bool:
        return False
