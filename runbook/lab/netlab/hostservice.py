"""A process the lab runs on this machine beside its nodes (the registry, the apt proxy): started in its own
session with its output in a log file, found again by its pid file and a path its command line names, waited for
until it answers, ended with SIGTERM then SIGKILL. One way for both, so ``up``, ``down`` and ``status`` treat them
alike."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runbook.errors import LabError

from .host import file_tail, pid_alive, tail_text


@dataclass(frozen=True)
class HostService:
    """``title`` names it in messages ("the lab registry"); ``owner`` is a path only its command line names, so
    a PID reused by another process, or another lab dir's copy, is never taken for it; ``answers(timeout)`` says
    whether it serves at ``addr``."""
    title: str
    addr: str
    pid_file: Path
    log_file: Path
    owner: Path
    answers: Callable[[float], bool]

    def pid(self) -> int | None:
        """Its PID while it runs (the pid file's process, whose command line names ``owner``)."""
        try:
            pid = int(self.pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) and str(self.owner).encode() in cmdline else None

    def running(self) -> int | None:
        """Its PID when it runs and answers; one that runs but does not answer is ended (the caller starts anew)."""
        pid = self.pid()
        if pid and self.answers(3):
            return pid
        if pid:
            self.stop()
        return None

    def start(self, argv: list[str], log: Callable[[str], None], *, timeout: float = 15, cwd: str | None = None,
              env: dict[str, str] | None = None) -> int:
        """Start ``argv`` and wait up to ``timeout`` s for it to answer; its PID. Fails naming the log's tail."""
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                    env=env, start_new_session=True)
        self.pid_file.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise LabError(f"{self.title} exited at start", observed=f"rc={proc.returncode}: "
                               f"{tail_text(file_tail(self.log_file))}",
                               fix=f"see {self.log_file}; is {self.addr} taken?")
            if self.answers(1):
                return proc.pid
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        raise LabError(f"{self.title} did not answer on {self.addr} within {timeout:.0f} s",
                       observed=tail_text(file_tail(self.log_file)), fix=f"see {self.log_file}")

    def stop(self, timeout: float = 10) -> str:
        """End it (only that process); a note on what was done ('' when none ran)."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return ""
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return f"stopped {self.title} (pid {pid})"

    def status(self) -> dict:
        """Address, PID, whether it answers, healthy (both)."""
        pid = self.pid()
        ok = self.answers(3) if pid else False
        return {"address": self.addr, "pid": pid, "answers": ok, "healthy": bool(pid) and ok}
