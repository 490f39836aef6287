"""Kernel and journal lines that explain a dead or stuck rank (pure parsers over ``dmesg`` /
``journalctl`` text): OOM kills (kernel, earlyoom, systemd-oomd), hung tasks (D state), mDNS
host-name conflicts, GPU driver out-of-memory.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

DMESG_CMD = ("(sudo -n dmesg -T 2>/dev/null || dmesg -T 2>/dev/null || "
             "journalctl -k -n 2000 --no-pager 2>&1) | tail -n 2000")
JOURNAL_CMD = ("journalctl -n 400 --no-pager -o short-iso -u earlyoom -u systemd-oomd -u avahi-daemon "
               "-u docker 2>&1 | tail -n 400")


@dataclass
class Kill:
    """A process killed (or, in a dry run, chosen) for lack of memory."""
    by: str               # "kernel" | "earlyoom" | "systemd-oomd"
    pid: int | None
    name: str
    line: str
    dry_run: bool = False


_KERNEL_OOM = re.compile(r"[Oo]ut of memory: Killed process (\d+) \(([^)]*)\)")
_EARLYOOM = re.compile(r'sending (SIGTERM|SIGKILL) to process (\d+)(?: uid \d+)? "([^"]*)"')
_OOMD = re.compile(r"systemd-oomd.*Killed (\S+) due to memory (?:pressure|used)")
_HUNG = re.compile(r"INFO: task (.+?):(\d+) blocked for more than (\d+) seconds")
_AVAHI = re.compile(r"Host name conflict, retrying with <?([^>\s]+)>?")
_NVRM_OOM = re.compile(r"NVRM:.*NV_ERR_NO_MEMORY")


def oom_kills(text: str) -> list[Kill]:
    """Kills in ``dmesg`` / journal text. Samples (captured: a memory cgroup's OOM kill in
    ``dmesg``; ``earlyoom --dryrun`` 1.7)::

        [  364.336057] Memory cgroup out of memory: Killed process 13801 (python) total-vm:114916kB, ...
        low memory! at or below SIGKILL limits: mem 98.00%, swap 100.00%
        sending SIGKILL to process 2 uid 0 "python": badness 675, VmRSS 313 MiB
        dryrun, not actually sending any signal
    """
    out: list[Kill] = []
    lines = (text or "").splitlines()
    dry_mode = False                     # earlyoom --dryrun announces itself once at start
    for i, line in enumerate(lines):
        if "earlyoom v" in line:
            dry_mode = False
        if "dryrun mode enabled" in line:
            dry_mode = True
        if m := _KERNEL_OOM.search(line):
            out.append(Kill("kernel", int(m.group(1)), m.group(2), line.strip()))
        elif m := _EARLYOOM.search(line):
            dry = dry_mode or any("dryrun, not actually sending" in nxt for nxt in lines[i + 1:i + 3])
            out.append(Kill("earlyoom", int(m.group(2)), m.group(3), line.strip(), dry_run=dry))
        elif m := _OOMD.search(line):
            out.append(Kill("systemd-oomd", None, m.group(1), line.strip()))
    return out


def gpu_oom_lines(text: str) -> list[str]:
    """``NVRM: ... NV_ERR_NO_MEMORY`` (unified memory exhausted; invisible to cgroups)."""
    return [l.strip() for l in (text or "").splitlines() if _NVRM_OOM.search(l)]


@dataclass
class HungTask:
    name: str
    pid: int
    seconds: int
    line: str


def hung_tasks(text: str) -> list[HungTask]:
    """``INFO: task python3:4242 blocked for more than 120 seconds.`` (kernel hung-task detector)."""
    return [HungTask(m.group(1), int(m.group(2)), int(m.group(3)), line.strip())
            for line in (text or "").splitlines() if (m := _HUNG.search(line))]


def hostname_conflicts(text: str) -> list[str]:
    """The names avahi fell back to (``Host name conflict, retrying with spark-head-2``), in order."""
    return [m.group(1).rstrip(".") for line in (text or "").splitlines() if (m := _AVAHI.search(line))]


def conflict_suffix(name: str) -> int | None:
    """``spark-head-528`` -> 528 (avahi's alternative-name counter), else None."""
    m = re.search(r"-(\d+)$", name)
    return int(m.group(1)) if m else None
