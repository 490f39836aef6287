"""What a catalogue entry is (:class:`Entry`, :class:`Hit`, the severities) and the readers of a
:class:`~runbook.diagnose.bundle.Bundle` that signatures of several families share.

A signature returns :class:`Hit` s (node + the evidence lines it matched); an empty list means the
entry does not apply. Signatures never raise on missing texts: a bundle collected before a rank
started, or without RDMA, simply has less to match.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Callable

from ...facts import sockets
from .. import bundle as B

FATAL, DEGRADED, WARNING = "fatal", "degraded", "warning"

SEVERITY_ORDER = {FATAL: 0, DEGRADED: 1, WARNING: 2}


@dataclass
class Hit:
    node: str
    evidence: list[str]
    vars: dict[str, str] = field(default_factory=dict)     # fills the proof command's {placeholders}


@dataclass(frozen=True)
class Entry:
    id: str
    title: str
    severity: str
    symptom: str          # what the user sees
    detect: str           # how the signature recognises it (for the docs)
    cause: str
    fix: str
    proof: str            # command that proves it on the node; {placeholders} from context and hit
    signature: Callable[[B.Bundle], list[Hit]] | None    # None: the entry is recognised by ``lines`` alone
    source: str = ""
    lines: tuple[str, ...] = ()     # regexes (case-insensitive) over one log line each: the failure's own text
    words: tuple[str, ...] = ()     # regexes over a reporter's prose: symptom cues; the first is the anchor
                                    # (offline, cues alone need the anchor and one more)
    symptoms: tuple[str, ...] = ()  # regexes over the whole text: a component's own message that this entry usually
                                    # explains but other causes can also produce (offline: ranked, never "high")
    lab: str = "none"               # the lab injection that produces it, or "none: <why>"
    downstream: bool = False        # a consequence that other entries explain (ranks below them offline)
    inferred: bool = False          # the signature infers the cause from a symptom (a log that stops, two settings
                                    # side by side), not from the failing component's own error: never "high"

    def line_hits(self, text: str, limit: int = 3) -> list[str]:
        """The lines of ``text`` that one of :attr:`lines` matches (at most ``limit``)."""
        if not self.lines:
            return []
        rx = _compiled(self.lines)
        if not rx.search(text):             # one pass over the whole text rejects most logs (MULTILINE: ^ is a line start)
            return []
        return lines_matching(text, rx, limit)

    def symptom_hits(self, text: str, limit: int = 3) -> list[str]:
        """The lines where one of :attr:`symptoms` matches: the line of its group ``at`` if it has one, else the
        line it starts on (a pattern may span lines: a signal line, then the NCCL frames under it)."""
        out: list[str] = []
        for rx in _compiled_each(self.symptoms):
            for m in rx.finditer(text):
                at = m.start("at") if "at" in rx.groupindex else m.start()
                line = text[text.rfind("\n", 0, at) + 1:].partition("\n")[0].strip()[:300]
                if line not in out:
                    out.append(line)
                if len(out) >= limit:
                    return out
        return out

    def cues(self, prose: str) -> dict[int, str]:
        """The :attr:`words` cues that hold in ``prose`` (lower-cased, whitespace folded): cue index -> the
        words that matched it (index 0 is the anchor)."""
        out = {}
        for i, rx in enumerate(_compiled_each(self.words)):
            m = rx.search(prose)
            if m:
                out[i] = m.group(0).strip()
        return out


_CACHE: dict[tuple[str, ...], re.Pattern] = {}
_CACHE_EACH: dict[tuple[str, ...], list[re.Pattern]] = {}


def _compiled(patterns: tuple[str, ...]) -> re.Pattern:
    if patterns not in _CACHE:
        _CACHE[patterns] = re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE | re.MULTILINE)
    return _CACHE[patterns]


def _compiled_each(patterns: tuple[str, ...]) -> list[re.Pattern]:
    if patterns not in _CACHE_EACH:
        _CACHE_EACH[patterns] = [re.compile(p, re.IGNORECASE) for p in patterns]
    return _CACHE_EACH[patterns]


#: the texts of a node that :func:`line_signature` reads (rank logs and the host's logs, not old starts)
LINE_TEXTS = (B.RANK_LOG, B.RAY_LOG, B.DMESG, B.JOURNAL, B.DOCKER_PULL, B.NCCL_CONF)


def line_signature(entry: "Entry", b: B.Bundle) -> list[Hit]:
    """The signature of an entry recognised by its own log lines: one hit per node whose logs hold one."""
    hits = []
    for node in [*b.nodes, B.LOCAL]:
        texts = list(dict.fromkeys(b.text(node, name) for name in LINE_TEXTS))     # each distinct text once
        ev = [f"{node}: {l}" for text in texts for l in entry.line_hits(text, 2)]
        if ev:
            hits.append(Hit(node, ev[:4]))
    return hits


def command_records(b: B.Bundle) -> list[dict]:
    """The records of the run's command log (``commands.jsonl`` under the local node), oldest first."""
    out = []
    for line in b.text(B.LOCAL, B.LOCAL_COMMANDS).splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def command_output(rec: dict) -> str:
    """What one command printed, as the command log keeps it (tails of stdout and stderr)."""
    return "\n".join(str(rec.get(k, "")) for k in ("stderr", "stdout", "stderr_tail", "stdout_tail") if rec.get(k))


def extracting(*patterns: str | tuple[str, dict[str, str]], texts: tuple[str, ...] = LINE_TEXTS, unless: str = "",
               check: Callable[[dict[str, str]], bool] | None = None,
               after: tuple[str, int] | None = None, within: str = "") -> Callable[[B.Bundle], list[Hit]]:
    """A signature for a family of messages: each pattern is the emitting source's message with named groups
    (``path``, ``port``, ``component``, ``package``, numbers) that go into the hit's evidence and fill the fix's
    ``{placeholders}``. ``unless``: a text holding it is explained by another entry. ``check``: the extracted
    values must pass it (e.g. a KV pool smaller than the requested length). A pattern may come with defaults:
    ``(regex, {"path": "/var/lib/docker"})`` for what its message implies but does not print. ``after``: (regex,
    chars): a match counts only when that regex occurs within ``chars`` before it (the phase an error belongs to);
    searched backwards from each match, never forwards from each phase line, so a long log stays linear.
    ``within``: a text counts only when it also holds this regex somewhere (the context that makes a library's
    message this entry's: a server, not any user of the library).
    Besides a node's logs it reads what the runbook's own commands on that node printed when they failed
    (``commands.jsonl``; a command that later ran again and passed no longer counts): a failed `docker run` or
    `docker pull` says why there, not in a rank log."""
    compiled = [(re.compile(p, re.IGNORECASE | re.MULTILINE), {}) if isinstance(p, str)
                else (re.compile(p[0], re.IGNORECASE | re.MULTILINE), p[1]) for p in patterns]
    skip = re.compile(unless, re.IGNORECASE | re.MULTILINE) if unless else None
    before = (re.compile(after[0], re.IGNORECASE | re.MULTILINE), after[1]) if after else None
    context = re.compile(within, re.IGNORECASE | re.MULTILINE) if within else None

    def sig(b: B.Bundle) -> list[Hit]:
        hits = []
        last: dict[tuple[str, str], dict] = {}
        for rec in command_records(b):
            last[(str(rec.get("node", B.LOCAL)), str(rec.get("command", "")))] = rec
        printed: dict[str, list[str]] = {}
        for (node, _), rec in last.items():
            if rec.get("exit_code") not in (0, None):
                printed.setdefault(node, []).append(command_output(rec))
        for node in dict.fromkeys([*b.nodes, *printed, B.LOCAL]):
            ev: list[str] = []
            found: dict[str, str] = {}
            for text in dict.fromkeys([*(b.text(node, name) for name in texts), "\n".join(printed.get(node, []))]):
                if not text or (skip and skip.search(text)) or (context and not context.search(text)):
                    continue
                for rx, implied in compiled:
                    for m in rx.finditer(text):
                        vals = {k: v.strip() for k, v in m.groupdict().items() if v}
                        said_vals = dict(vals)
                        vals = {**implied, **vals}
                        if check is not None and not check(vals):
                            continue
                        if before and not before[0].search(text, max(0, m.start() - before[1]), m.start()):
                            continue
                        start = text.rfind("\n", 0, m.start()) + 1
                        end = text.find("\n", m.end())
                        line = text[start:end if end >= 0 else len(text)].strip()[:300]
                        said = ", ".join(f"{k}={v}" for k, v in said_vals.items())
                        item = f"{node}: {line}" + (f" [{said}]" if said else "")
                        if item not in ev:
                            ev.append(item)
                        for k, v in vals.items():
                            found.setdefault(k, v)
                        break                       # one line per pattern and text
            if ev:
                hits.append(Hit(node, ev[:4], found))
        return hits
    return sig


def either(*sigs):
    """A signature that holds where any of ``sigs`` holds (the first one's hits on a node win)."""
    def sig(b):
        out, seen = [], set()
        for s in sigs:
            for h in s(b):
                if h.node not in seen:
                    seen.add(h.node)
                    out.append(h)
        return out
    return sig


CLIENTS_JOINED = re.compile(r"DistStoreError: Timed out after \d+ seconds waiting for clients\. \d+/\d+ clients joined")

_CLIENT_TIMEOUT = re.compile(r"client socket has (?:timed out after \d+ms while trying to connect to|"
                             r"failed to connect to any network address of) \((\S+?), (\d+)\)")

STARTUP_DONE = re.compile(r"Application startup complete")

#: NCCL's wrapper of the verbs call (NVIDIA/nccl src/misc/ibvwrap.cc wrap_ibv_reg_mr*: WARN "Call to
#: ibv_reg_mr_iova2 failed with error %s"): ENOMEM from the kernel's pin of the pages. Three causes print it: the
#: process's RLIMIT_MEMLOCK (ib_umem_get's check against the locked-memory limit), a kernel with no CMA on GB10, a
#: kernel's own registration regression. A symptom for each of the three entries, never "high" on its own.
REG_MR_ENOMEM = r"ibv_reg_mr\w*(?:[^\n]*failed with error Cannot allocate memory|[^\n]*\bENOMEM\b)"


def lines_matching(text: str, rx: re.Pattern, limit: int = 3) -> list[str]:
    out = []
    for line in text.splitlines():
        if rx.search(line):
            out.append(line.strip()[:300])
            if len(out) >= limit:
                break
    return out


def rendezvous_failures(b: B.Bundle) -> list[str]:
    """Evidence that the rendezvous did not complete, from every node."""
    ev = []
    for node, text in b.logs():
        ev += [f"{node}: {l}" for l in lines_matching(text, CLIENTS_JOINED, 1)]
        ev += [f"{node}: {l}" for l in lines_matching(text, _CLIENT_TIMEOUT, 1)]
    port = b.context.master_port
    for node in b.nodes:
        for s in sockets.connecting_to(sockets.parse_ss(b.text(node, B.SS)), port) if port else []:
            ev.append(f"{node}: socket {s.describe()} (SYN-SENT: no answer from the master port)")
        for t in sockets.parse_tcp_connect(b.text(node, B.TCP_MASTER)):
            if t.result in ("timeout", "unreachable"):
                ev.append(f"{node}: tcp connect {t.host}:{t.port} -> {t.result} after {t.ms} ms")
    return ev


def plan_env(plan: str) -> dict[str, dict[str, str]]:
    """node -> KEY=VALUE assignments of its ``env ...`` line in a rendered launch plan."""
    out: dict[str, dict[str, str]] = {}
    node = None
    for line in plan.splitlines():
        m = re.match(r"^## rank \d+ on (\S+)", line)
        if m:
            node = m.group(1)
            continue
        if node and line.startswith("env "):
            try:
                words = shlex.split(line.rstrip("\\ "))
            except ValueError:
                continue
            out[node] = dict(w.split("=", 1) for w in words[1:] if re.match(r"^[A-Z_][A-Z0-9_]*=", w))
            node = None
    return out
