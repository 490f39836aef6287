"""The one check/result type every step reports through.

A step collects ``Check`` records in a ``CheckList``; its summary cell renders the table and
raises ``CheckFailed`` if any check failed. Sidecars store ``CheckList.to_records()``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Iterable

from .errors import CheckFailed


class Status(str, Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    WARN = "WARN"      # flagged for a human, does not fail the step
    NA = "N/A"         # not applicable on this profile (e.g. RDMA in the lab) -- never a pass
    NOOP = "NO-OP"     # an action found the node already in the desired state
    SIMULATED = "SIMULATED"  # rehearsal: a hardware-only tool was stood in for by a simulator that checked
                             # the invocation it got -- shows the command is right, never that the hardware is

    def __str__(self) -> str:
        return self.value


@dataclass
class Check:
    name: str
    node: str = ""                 # "head", "worker", "cluster", "" (local)
    status: Status = Status.PASS
    observed: str = ""
    expected: str = ""
    fix: str = ""                  # one line, shown when the check did not pass
    evidence: list[str] = field(default_factory=list)   # paths relative to the run dir
    data: dict[str, Any] = field(default_factory=dict) # numbers the report recomputes
    cause: str = ""                # what a failing row is evidence of, one of CAUSES ("" = this row's own check)

    @property
    def failed(self) -> bool:
        return self.status is Status.FAIL

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        record["status"] = self.status.value
        if not self.cause:            # records of ordinary rows stay as they were
            record.pop("cause")
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "Check":
        values = dict(record)
        values["status"] = Status(values.get("status", "PASS"))
        return cls(**values)


def check(name: str, ok: bool, *, node: str = "", observed: Any = "", expected: Any = "",
          fix: str = "", warn_only: bool = False, evidence: Iterable[str] = (),
          data: dict[str, Any] | None = None, cause: str = "") -> Check:
    """Build a check from a boolean: PASS if ok, else FAIL (or WARN when ``warn_only``). ``cause``: what the row
    is evidence of when it fails (:data:`CAUSES`), which ranks its fix in :func:`first_fix`."""
    if cause and cause not in CAUSES:
        raise ValueError(f"cause {cause!r} is not one of {CAUSES}")
    status = Status.PASS if ok else (Status.WARN if warn_only else Status.FAIL)
    return Check(name=name, node=node, status=status, observed=str(observed),
                 expected=str(expected), fix="" if ok else fix, evidence=list(evidence),
                 data=dict(data or {}), cause=cause)


# What a failing row can be evidence of, the most fundamental first: a node that does not answer explains
# everything measured on it; a server (API or a rank) gone explains every request that failed after it; a broken
# fabric explains the collectives. A row without a cause is evidence of its own check only.
CAUSES = ("node", "server", "fabric")


def first_fix(steps: Iterable[tuple[str, Iterable[Any]]]) -> tuple[str, Any] | None:
    """The one failing row whose fix comes first after a failure, as (step, row): the row with the most fundamental
    cause (:data:`CAUSES`), else the first failing row in step order. The one place this is decided: the console's
    last lines and the report's "Next" both ask it, so they cannot name different fixes.

    >>> rows = [("07_bench", [check("/tokenize served", False, fix="serve /tokenize")]),
    ...         ("07_bench", [check("server answers /health", False, cause="server", fix="the API is gone")])]
    >>> step, row = first_fix(rows); row.fix
    'the API is gone'
    """
    best: tuple[int, int, str, Check] | None = None
    order = 0
    for step, rows in steps:
        for row in rows:
            if row.status != Status.FAIL:        # a Check's Status or a report row's "FAIL"
                continue
            rank = CAUSES.index(row.cause) if row.cause in CAUSES else len(CAUSES)
            if best is None or (rank, order) < best[:2]:
                best = (rank, order, step, row)
            order += 1
    return None if best is None else (best[2], best[3])


def simulated(item: Check, why: str) -> Check:
    """The rehearsal's form of a hardware-only row: a passing row becomes SIMULATED (its observed value came
    from a simulator, not from the hardware); a failing row stays FAIL -- the invocation was wrong."""
    if item.status is Status.FAIL:
        return item
    item.status = Status.SIMULATED
    item.observed = f"{item.observed} [simulated: {why}]" if item.observed else f"[simulated: {why}]"
    return item


def not_applicable(name: str, reason: str, *, node: str = "", expected: Any = "") -> Check:
    return Check(name=name, node=node, status=Status.NA, observed=reason, expected=str(expected))


class CheckList(list):
    """A list of ``Check`` with table rendering and the fail-closed summary."""

    def add(self, item: Check | Iterable[Check]) -> Check | Iterable[Check]:
        if isinstance(item, Check):
            self.append(item)
        else:
            self.extend(item)
        return item

    def failures(self) -> list[Check]:
        return [c for c in self if c.failed]

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in Status}
        for c in self:
            out[c.status.value] += 1
        return out

    def to_records(self) -> list[dict[str, Any]]:
        return [c.to_record() for c in self]

    @classmethod
    def from_records(cls, records: Iterable[dict[str, Any]]) -> "CheckList":
        return cls(Check.from_record(r) for r in records)

    def to_frame(self):
        import pandas as pd
        columns = ["name", "node", "status", "observed", "expected", "fix"]
        return pd.DataFrame([{k: getattr(c, k) if k != "status" else c.status.value
                              for k in columns} for c in self], columns=columns)

    def to_text(self) -> str:
        """A plain-text table (for logs and for headless runs)."""
        rows = [("name", "node", "status", "observed", "expected", "fix")]
        rows += [(c.name, c.node, c.status.value, c.observed, c.expected, c.fix) for c in self]
        widths = [min(48, max(len(r[i]) for r in rows)) for i in range(6)]
        lines = []
        for r in rows:
            lines.append("  ".join(_clip(v, w).ljust(w) for v, w in zip(r, widths)).rstrip())
        return "\n".join(lines)

    def raise_on_failure(self, step: str = "") -> None:
        failed = self.failures()
        if not failed:
            return
        first = failed[0]
        names = ", ".join(f"{c.name}@{c.node or 'local'}" for c in failed)
        raise CheckFailed(f"{step + ': ' if step else ''}{len(failed)} check(s) failed: {names}",
                          node=first.node, observed=first.observed, expected=first.expected,
                          fix=first.fix)


def _clip(value: str, width: int) -> str:
    value = value.replace("\n", " ")
    return value if len(value) <= width else value[: width - 1] + "…"
