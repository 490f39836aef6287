"""Offline diagnosis: rank the catalogue's entries against pasted logs, a support bundle or a symptom sentence,
with no nodes and no profile, and say "no known failure matches" rather than guess.

One matcher serves the live and the offline mode: a bundle (live, or one a user sent) goes through
:func:`~runbook.diagnose.match.match` and every finding counts as a log match; free text goes through the
same signatures (the text stands in for every log of one node) plus each entry's own log lines
(:attr:`Entry.lines`) and symptom cues (:attr:`Entry.words`).

Scoring (per entry): a log line of the entry, or its signature holding, scores :data:`LINE_SCORE`
(:data:`DOWNSTREAM_SCORE` for an entry that others explain, such as the 600 s watchdog); a symptom
(:attr:`Entry.symptoms`: a component's message that other causes can also produce) scores
:data:`SYMPTOM_SCORE` with confidence ``medium`` at most; each symptom cue
adds one point, and cues alone count only from :data:`MIN_CUES` on and only with the entry's first cue
(its anchor: the symptom that defines it). Confidence: ``high`` (a log line or a
signature; ``medium`` when the entry's signature infers its cause from a symptom, :attr:`Entry.inferred`),
``medium`` (three or more cues), ``low`` (two cues). Ties keep the catalogue's severity order.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from . import bundle as B
from .catalogue import ENTRIES
from .catalogue.entry import SEVERITY_ORDER, Entry
from .inputs import Budget, InputError, read_folder, read_text
from .match import match, render_fix

LINE_SCORE = 10
SYMPTOM_SCORE = 6                 # a message other causes can also produce: below any line, above most cue sets
DOWNSTREAM_SCORE = 4
MIN_CUES = 2
MAX_TEXT_BYTES = 8 << 20          # the end of a larger log is kept: the failure is usually last

NO_MATCH = "no known failure matches"


@dataclass
class Ranked:
    """One entry that matched, with what made it match."""
    entry: Entry
    score: int
    confidence: str                      # high | medium | low
    lines: list[str] = field(default_factory=list)     # the log lines (or findings' evidence) that matched
    cues: list[str] = field(default_factory=list)      # the reporter's words that matched a symptom cue
    fix: str = ""                                       # the fix with the bundle's values filled (else the entry's)

    @property
    def id(self) -> str:
        return self.entry.id

    def to_dict(self) -> dict:
        e = self.entry
        return {"id": e.id, "title": e.title, "severity": e.severity, "confidence": self.confidence,
                "score": self.score, "lines": self.lines, "cues": self.cues, "cause": e.cause, "fix": self.fix or render_fix(e.fix, {}),
                "source": e.source}

    def to_text(self, rank: int) -> str:
        e = self.entry
        out = [f"{rank}. {e.id} [{self.confidence} confidence, score {self.score}] {e.title}"]
        if self.lines:
            out.append("   matched lines:")
            out += [f"     {l[:300]}" for l in self.lines[:5]]
        if self.cues:
            out.append(f"   symptom cues ({len(self.cues)} of {len(e.words)}): " + ", ".join(f'"{c}"' for c in self.cues))
        out += [f"   cause: {e.cause}", f"   fix:   {self.fix or render_fix(e.fix, {})}", f"   source: {e.source}"]
        return "\n".join(out)


#: a line a program wrote (log prefix, timestamp, traceback, shell prompt, table): symptom cues skip it
_LOG_LINE = re.compile(
    r"^\s*(?:\(\w+ pid=\d+\)|(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\b|[IWEF]\d{4} \d\d:\d\d|"
    r"\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d|\[\s*\d+\.\d+\]|\w{3} +\d+ \d\d:\d\d:\d\d |"
    r"[\w.-]+:\d+:\d+ \[\d+\]|File \"|Traceback|[\w.]*(?:Error|Exception|Warning):|\$ |[|+=#-]{2,})"
    r"|\b(?:NCCL (?:INFO|WARN|TRACE)|INFO|WARNING|ERROR|DEBUG)\b")


def _prose(text: str) -> str:
    """The reporter's own sentences: the text without the lines a program wrote, lower-cased, whitespace
    folded. Cues read only these, so a long log cannot add up chance cues."""
    kept = [l for l in text.splitlines() if not _LOG_LINE.search(l)]
    return re.sub(r"\s+", " ", " ".join(kept).lower())


def _text_bundle(text: str) -> B.Bundle:
    """The pasted text as every log of one node (the head): rank log, kernel log, journal, nccl.conf,
    meminfo and the rank's environment (``KEY=VALUE`` lines); as docker pull output only when it looks like one (a pull error's words are common elsewhere)."""
    texts = {B.RANK_LOG: text, B.DMESG: text, B.JOURNAL: text, B.NCCL_CONF: text, B.MEMINFO: text, B.ENV: text}
    if re.search(r"docker|\bpull(ing)?\b|Error response from daemon|registry|manifest", text, re.IGNORECASE):
        texts[B.DOCKER_PULL] = text
    return B.Bundle(texts={"head": texts})


def _rank(found: dict[str, Ranked], entries: tuple[Entry, ...]) -> list[Ranked]:
    order = {e.id: i for i, e in enumerate(entries)}
    return sorted(found.values(), key=lambda r: (-r.score, SEVERITY_ORDER.get(r.entry.severity, 9), order[r.id]))


def _line_score(entry: Entry) -> int:
    return DOWNSTREAM_SCORE if entry.downstream else LINE_SCORE


def _line_confidence(entry: Entry) -> str:
    return "medium" if entry.inferred else "high"


def diagnose_text(text: str, entries: tuple[Entry, ...] = ENTRIES) -> list[Ranked]:
    """Entries ranked against a pasted log or a symptom sentence (best first); empty: nothing known matches."""
    raw = text.encode("utf-8", "replace")
    if len(raw) > MAX_TEXT_BYTES:       # the end, from a whole line on (a cut line could hold half a secret)
        text = raw[-MAX_TEXT_BYTES:].decode("utf-8", "replace").partition("\n")[2]
    by_id = {e.id: e for e in entries}
    found: dict[str, Ranked] = {}
    for f in match(_text_bundle(text), entries):
        entry = by_id.get(f.id)
        if entry is None:                     # a signature that raised: never a match
            continue
        r = found.setdefault(f.id, Ranked(entry, _line_score(entry), _line_confidence(entry), fix=f.fix))
        r.lines += [e.split(": ", 1)[-1] for e in f.evidence if e not in r.lines]
    for entry in entries:
        if entry.id in found or entry.signature is None:     # no signature: match() read its lines already
            continue
        lines = entry.line_hits(text, 5)
        if lines:
            found[entry.id] = Ranked(entry, _line_score(entry), _line_confidence(entry), lines)
    for entry in entries:
        if entry.id not in found:
            lines = entry.symptom_hits(text)
            if lines:
                found[entry.id] = Ranked(entry, SYMPTOM_SCORE, "medium", lines)
    prose = _prose(text)
    for entry in entries:
        hits = entry.cues(prose)
        cues = list(hits.values())
        if entry.id in found:
            found[entry.id].cues = cues
            found[entry.id].score += len(cues)
        elif len(cues) >= MIN_CUES and 0 in hits:
            found[entry.id] = Ranked(entry, len(cues), "medium" if len(cues) >= 3 else "low", cues=cues)
    return _rank(found, entries)


def diagnose_bundle(bundle: B.Bundle, entries: tuple[Entry, ...] = ENTRIES) -> list[Ranked]:
    """Entries ranked over a collected bundle: every finding of :func:`match` is a log match."""
    by_id = {e.id: e for e in entries}
    found: dict[str, Ranked] = {}
    for f in match(bundle, entries):
        entry = by_id.get(f.id)
        if entry is None:
            continue
        r = found.setdefault(f.id, Ranked(entry, _line_score(entry), _line_confidence(entry), fix=f.fix))
        r.lines += [e for e in f.evidence if e not in r.lines]
    return _rank(found, entries)


def is_bundle(path: Path) -> bool:
    """A support bundle: a ``diagnose-*.tar.gz`` archive or a directory laid out like one (``context.json``,
    or ``<node>/<name>`` texts one level down)."""
    if path.is_dir():
        return (path / "context.json").is_file() or any(
            c.is_dir() and any(f.is_file() for f in c.iterdir()) for c in path.iterdir())
    return path.name.endswith((".tar.gz", ".tgz"))


def diagnose_inputs(paths: Iterable[str | Path] = (), text: str = "", redactor=None) -> list[Ranked]:
    """Offline diagnosis of log files, support bundles and a symptom sentence together (best first).

    Every file is read through :mod:`.inputs` (regular text files only, :data:`~.inputs.MAX_INPUT_BYTES` for all
    inputs together, streamed); a missing, unreadable, oversized, endless or binary input raises
    :class:`~.inputs.InputError` naming it, before anything is matched. With a ``redactor``
    (:class:`runbook.secrets.Redactor`) every text is masked before it is matched, so no matched line can carry a
    secret, not even one a line cut would leave too short for its shape."""
    from .archive import read_bundle
    paths = [Path(p) for p in paths]
    missing = [str(p) for p in paths if not os.path.lexists(p)]
    if missing:
        raise InputError(f"no such log or bundle: {', '.join(missing)}",
                         fix="pass existing files, a diagnose-*.tar.gz or its folder")
    budget = Budget()
    bundles, texts = [], [text] if text.strip() else []
    for p in paths:
        if p.is_dir() and is_bundle(p) or p.name.endswith((".tar.gz", ".tgz")):
            bundles.append(read_bundle(p, budget))
        elif p.is_dir():                       # a folder of plain logs: every file in it
            texts += list(read_folder(p, budget).values())
        else:
            texts.append(read_text(p, budget))
    if redactor is not None:
        texts = [redactor(t) for t in texts]
        for b in bundles:
            b.texts = {node: {name: redactor(t) for name, t in items.items()} for node, items in b.texts.items()}
    results: list[list[Ranked]] = [diagnose_bundle(b) for b in bundles]
    if texts:
        results.append(diagnose_text("\n".join(texts)))
    merged: dict[str, Ranked] = {}
    for ranked in results:
        for r in ranked:
            old = merged.get(r.id)
            if old is None or r.score > old.score:
                merged[r.id] = r
    return _rank(merged, ENTRIES)


def redact(ranked: list[Ranked], redactor) -> list[Ranked]:
    """Copies whose matched lines, cues and fix went through ``redactor`` (a :class:`runbook.secrets.Redactor`)
    whole, before :meth:`Ranked.to_text` cuts a line: a secret cut in two would match no shape."""
    return [Ranked(r.entry, r.score, r.confidence, [redactor(l) for l in r.lines], [redactor(c) for c in r.cues],
                   redactor(r.fix)) for r in ranked]


def render(ranked: list[Ranked], *, top: int = 5) -> str:
    """The ranked matches as text, or the one line that says nothing known matched."""
    if not ranked:
        return (f"{NO_MATCH}.\nNone of the {len(ENTRIES)} catalogue entries has a log line or enough symptom "
                f"cues in this text; send the support bundle (python -m runbook diagnose) to a maintainer.")
    shown = ranked[:top]
    head = f"{len(ranked)} known failure(s) match, best first" + (f" (top {top} shown)" if len(ranked) > top else "")
    return head + ":\n\n" + "\n\n".join(r.to_text(i + 1) for i, r in enumerate(shown))
