"""Error types. Every error carries what failed, observed vs expected, how to fix it, and
where the evidence is, so a notebook cell or the CLI can print one self-contained message."""
from __future__ import annotations

from dataclasses import dataclass


class RunbookError(Exception):
    """Base error. ``str(err)`` is the four-part message."""

    exit_code = 1

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

    exit_code = 2

    def __init__(self, issues: list[ProfileIssue]):
        self.issues = list(issues)
        lines = "\n".join(f"  - {issue}" for issue in self.issues)
        super().__init__(f"profile rejected ({len(self.issues)} problem(s)):\n{lines}")

    def message(self) -> str:  # the issue list is the whole message
        return self.what


# The seeds' start contract: exit 3 means "the ranks are already running" (dockerd restored them after a
# reboot, `restart: unless-stopped`); systemd units treat it as success (SuccessExitStatus=3). No error
# class uses 3.
ALREADY_RUNNING = 3


class RemoteError(RunbookError):
    """A command on a node could not be run, failed, or timed out."""
    exit_code = 8


class ActionError(RunbookError):
    """An action (something that changes a node) could not reach its desired state."""
    exit_code = 4


class CheckFailed(RunbookError):
    """One or more checks of a step failed; raised by the step's summary cell."""
    exit_code = 5


class BenchError(RunbookError):
    exit_code = 6


class LabError(RunbookError):
    """The local two-node lab could not be brought up or down."""
    exit_code = 7

