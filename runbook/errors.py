"""Error types. Every error carries what failed, observed vs expected, how to fix it, and
where the evidence is, so a notebook cell or the CLI can print one self-contained message."""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class ExitStatus(IntEnum):
    """Exit codes of ``python -m runbook`` (README's table is checked against this by a unit test)."""
    OK = 0                 # done (status/logs: the server is up)
    FAILED = 1             # a step or check failed (no more specific class; a killed kernel, a timeout)
    INVALID = 2            # the profile, the secrets file or the arguments are invalid: nothing was run
    ALREADY_RUNNING = 3    # `start` found the ranks already running (the seeds' contract, not a failure)
    ACTION_FAILED = 4      # an action could not reach its state
    CHECKS_FAILED = 5      # checks failed
    BENCH_FAILED = 6       # benchmark error
    LAB_FAILED = 7         # lab error
    REMOTE_FAILED = 8      # a remote command failed
    BUSY = 9               # another run holds the cluster (or the run folder): nothing was changed
    SERVER_DOWN = 10       # status/logs: the server is not up (status: nothing of it runs on any node)
    SERVER_PARTIAL = 11    # status: some ranks run, or every rank runs while /health is not 200
    SERVER_FROZEN = 12     # status: a rank's vLLM process is stopped (state T: SIGSTOP, a debugger)
    SERVER_ORPHANED = 13   # status: vLLM processes or containers left on a node with no rank running
    INTERRUPTED = 130      # Ctrl-C


class RunbookError(Exception):
    """Base error. ``str(err)`` is the four-part message."""

    exit_code: int = ExitStatus.FAILED

    def __init__(self, what: str, *, node: str = "", observed: str = "", expected: str = "",
                 fix: str = "", evidence: str = ""):
        self.what = what
        self.node = node
        self.observed = observed
        self.expected = expected
        self.fix = fix
        self.evidence = evidence
        super().__init__(self.message())

    def message(self) -> str:
        head = f"[{self.node}] {self.what}" if self.node else self.what
        parts = [head]
        if self.observed or self.expected:
            parts.append(f"  observed: {self.observed}")
            parts.append(f"  expected: {self.expected}")
        if self.fix:
            parts.append(f"  fix: {self.fix}")
        if self.evidence:
            parts.append(f"  evidence: {self.evidence}")
        return "\n".join(parts)


@dataclass
class ProfileIssue:
    """One problem in a profile file, located to a line."""
    key: str
    message: str
    fix: str = ""
    path: str = ""
    line: int = 0

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else (self.path or "<profile>")
        text = f"{where}: {self.key}: {self.message}"
        return text + (f" (fix: {self.fix})" if self.fix else "")


class ProfileError(RunbookError):
    """The profile is invalid. Raised before any connection is made."""

    exit_code = ExitStatus.INVALID

    def __init__(self, issues: list[ProfileIssue]):
        self.issues = list(issues)
        lines = "\n".join(f"  - {issue}" for issue in self.issues)
        super().__init__(f"profile rejected ({len(self.issues)} problem(s)):\n{lines}")

    def message(self) -> str:  # the issue list is the whole message
        return self.what


# The seeds' start contract: exit 3 means "the ranks are already running" (dockerd restored them after a
# reboot, `restart: unless-stopped`); systemd units treat it as success (SuccessExitStatus=3). No error
# class uses 3.
ALREADY_RUNNING = ExitStatus.ALREADY_RUNNING


class UsageError(RunbookError):
    """The command line is invalid (a ``-p`` that is not KEY=VALUE, an unknown step, a run folder the runbook
    did not make): nothing was run."""
    exit_code = ExitStatus.INVALID


class BusyError(RunbookError):
    """Another run holds the cluster's lock (or the run folder's): nothing was changed."""
    exit_code = ExitStatus.BUSY


class RemoteError(RunbookError):
    """A command on a node could not be run, failed, or timed out."""
    exit_code = ExitStatus.REMOTE_FAILED


class ActionError(RunbookError):
    """An action (something that changes a node) could not reach its desired state."""
    exit_code = ExitStatus.ACTION_FAILED


class CheckFailed(RunbookError):
    """One or more checks of a step failed; raised by the step's summary cell."""
    exit_code = ExitStatus.CHECKS_FAILED


class BenchError(RunbookError):
    exit_code = ExitStatus.BENCH_FAILED


class LabError(RunbookError):
    """The local two-node lab could not be brought up or down."""
    exit_code = ExitStatus.LAB_FAILED


def exit_status_of(error_name: str) -> ExitStatus:
    """The exit status of an error known by its class name only (a notebook's exception, ``ename`` in
    papermill): the class's own code for the runbook's errors and their subclasses, else FAILED."""
    todo, seen = [RunbookError], {}
    while todo:
        cls = todo.pop()
        seen[cls.__name__] = cls
        todo += cls.__subclasses__()
    cls = seen.get(error_name)
    return ExitStatus(int(cls.exit_code)) if cls is not None else ExitStatus.FAILED

