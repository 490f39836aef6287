"""Measure the offline matcher on a corpus of real symptom texts and log lines: top-1, top-3 and false alarms
per split (tune / holdout / frozen) and per kind (log / mixed / words).

The corpus is JSON lines (``*.jsonl`` in one folder, by default ``tests/unit/diagnose/corpus``), one case a
line: ``id``, ``expect`` (a catalogue id, or null for an off-domain text that must match nothing), ``kind``
(``log`` or ``words``), ``split`` (``tune`` or ``holdout``), ``source`` (the public report it comes from) and
``text`` (or ``file``: a path relative to the repository root, for a whole captured log).

A held-out case whose true cause has no entry yet says so: ``expect`` is ``none:<slug>`` (the slug the entry
would get). It counts as a positive that no answer can satisfy, so a corpus collected before the entries
exist is measured as it is; once an entry with that id exists, the case expects it.

A positive case is top-1 when the best-ranked entry is the expected one and top-3 when it is among the first
three; a negative case is a false alarm when anything at all matches. Signatures are tuned on ``tune`` cases
only; ``holdout`` says how well that carries over. ``frozen`` is the held-out set of issue 36
(``tests/unit/data/diagnose_frozen``): real reports set aside by repository before the families they test were
written, never tuned on; the default corpus includes it, so its rows always print beside the tuning figures.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .catalogue import BY_ID
from .offline import diagnose_text

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CORPUS = ROOT / "tests" / "unit" / "diagnose" / "corpus"
FROZEN_CORPUS = ROOT / "tests" / "unit" / "data" / "diagnose_frozen"
KINDS = ("log", "mixed", "words")
SPLITS = ("tune", "holdout", "frozen")
_KEYS = {"id", "expect", "kind", "split", "source", "text", "file"}
UNCATALOGUED = "none:"                 # expect prefix: the thread's cause has no entry (yet)
_SLUG = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


def _expected(value: str | None, where: str) -> str | None:
    """The catalogue id a case expects: ``none:<slug>`` becomes ``<slug>`` once that entry exists."""
    if value is None or value in BY_ID:
        return value
    if isinstance(value, str) and value.startswith(UNCATALOGUED):
        slug = value[len(UNCATALOGUED):]
        if not _SLUG.fullmatch(slug):
            raise ValueError(f"{where}: expect {value!r}: after {UNCATALOGUED!r} comes the entry id it would get "
                             f"(lower-case words joined by '-')")
        return slug if slug in BY_ID else value
    raise ValueError(f"{where}: expect {value!r} is no catalogue id (fix: an id from ENTRIES, "
                     f"{UNCATALOGUED}<slug> for a cause with no entry yet, or null)")


@dataclass(frozen=True)
class Case:
    id: str
    expect: str | None
    kind: str
    split: str
    source: str
    text: str


def load_corpus(folder: str | Path = DEFAULT_CORPUS) -> list[Case]:
    """Every case of every ``*.jsonl`` file in ``folder``; ValueError naming the file and line on a bad case."""
    folder = Path(folder)
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no *.jsonl corpus files in {folder} (fix: pass --corpus <folder with cases>)")
    if folder.resolve() == DEFAULT_CORPUS.resolve() and FROZEN_CORPUS.is_dir():     # the held-out set rides along
        files += sorted(FROZEN_CORPUS.glob("*.jsonl"))
    cases: list[Case] = []
    seen: set[str] = set()
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            where = f"{path.parent.name}/{path.name}:{n}"
            try:
                d = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not JSON ({exc})") from None
            unknown = set(d) - _KEYS
            if unknown:
                raise ValueError(f"{where}: unknown key(s) {sorted(unknown)} (known: {sorted(_KEYS)})")
            expect = _expected(d.get("expect"), where)
            if d.get("kind") not in KINDS or d.get("split") not in SPLITS:
                raise ValueError(f"{where}: kind must be one of {KINDS} and split one of {SPLITS}")
            if not str(d.get("source", "")).strip():
                raise ValueError(f"{where}: every case names its source")
            if d.get("id") in seen:
                raise ValueError(f"{where}: duplicate id {d.get('id')!r}")
            seen.add(d["id"])
            if "file" in d:
                text = (ROOT / d["file"]).read_text(encoding="utf-8", errors="replace")
            else:
                text = d.get("text", "")
            if not text.strip():
                raise ValueError(f"{where}: empty text")
            cases.append(Case(d["id"], expect, d["kind"], d["split"], d["source"], text))
    return cases


@dataclass
class Cell:
    """Counts of one group of cases (a split, a kind, or both)."""
    positives: int = 0
    top1: int = 0
    top3: int = 0
    negatives: int = 0
    false_alarms: int = 0
    confident_wrong: int = 0      # a positive whose first name is wrong with confidence "high"
    misses: list[str] = field(default_factory=list)      # "case id: expected -> got"
    uncatalogued: int = 0         # positives whose cause has no entry (expect none:<slug>): always a miss

    def top1_pct(self) -> float | None:
        return 100.0 * self.top1 / self.positives if self.positives else None

    def top3_pct(self) -> float | None:
        return 100.0 * self.top3 / self.positives if self.positives else None


@dataclass
class Report:
    cells: dict[tuple[str, str], Cell]     # (split or "all", kind or "all")
    classes: int                           # distinct expected entries among the positives

    def cell(self, split: str = "all", kind: str = "all") -> Cell:
        return self.cells[(split, kind)]

    def table(self) -> str:
        def pct(v: float | None) -> str:
            return "-" if v is None else f"{v:5.1f} %"
        rows = ["| split | kind | cases | no entry | top-1 | top-3 | off-domain | false alarms | high-confidence wrong |",
                "|---|---|---|---|---|---|---|---|---|"]
        for split in (*SPLITS, "all"):
            for kind in (*KINDS, "all"):
                c = self.cells[(split, kind)]
                if not c.positives and not c.negatives:
                    continue
                rows.append(f"| {split} | {kind} | {c.positives} | {c.uncatalogued} | {pct(c.top1_pct())} | {pct(c.top3_pct())} | "
                            f"{c.negatives} | {c.false_alarms} | {c.confident_wrong} |")
        return "\n".join(rows) + "\n"


def evaluate(cases: list[Case]) -> Report:
    """Run the offline matcher on every case and count top-1, top-3 and false alarms per split and kind."""
    cells = {(s, k): Cell() for s in (*SPLITS, "all") for k in (*KINDS, "all")}
    for case in cases:
        ranked = diagnose_text(case.text)
        for key in ((case.split, case.kind), (case.split, "all"), ("all", case.kind), ("all", "all")):
            cell = cells[key]
            if case.expect is None:
                cell.negatives += 1
                if ranked:
                    cell.false_alarms += 1
                    cell.misses.append(f"{case.id}: off-domain -> {ranked[0].id}")
                continue
            cell.positives += 1
            cell.uncatalogued += case.expect.startswith(UNCATALOGUED)
            cell.top1 += bool(ranked) and ranked[0].id == case.expect
            cell.top3 += case.expect in [r.id for r in ranked[:3]]
            if ranked and ranked[0].id != case.expect and ranked[0].confidence == "high":
                cell.confident_wrong += 1
            if not ranked or ranked[0].id != case.expect:
                cell.misses.append(f"{case.id}: {case.expect} -> {ranked[0].id if ranked else 'nothing'}")
    return Report(cells, len({c.expect for c in cases if c.expect and not c.expect.startswith(UNCATALOGUED)}))
