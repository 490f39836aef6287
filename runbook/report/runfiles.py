"""Reading one run folder: JSON files, sidecars, the evidence paths the steps recorded.

Every path the report opens comes from a sidecar (a check's ``evidence`` list, a path in its ``data``)
or from :meth:`runbook.evidence.RunDir.raw_path` for a file a step archives without listing it; none is
spelled out here.
"""
from __future__ import annotations

import json
import math
import re
import traceback
from pathlib import Path
from typing import Any, Iterator

from ..records import Record, RecordError, record_from_sidecar, step_info

__all__ = ["load_json", "read_text", "relative", "number", "read_sidecars", "find_sidecar", "record_of", "evidence_file",
           "first_evidence", "data_paths", "where"]


def load_json(path: Path) -> Any:
    """The parsed file, or None when it is missing or not JSON (an optional gap, never an exception)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def relative(run: Path, path: Path) -> str:
    """``path`` relative to the run folder (as the sidecars write it), else as given."""
    try:
        return str(path.relative_to(run))
    except ValueError:
        return str(path)


def number(x: Any) -> float | None:
    """A finite float, or None (booleans, text, NaN and inf are not numbers here)."""
    if isinstance(x, bool) or x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def read_sidecars(run: Path) -> dict[str, dict[str, Any]]:
    """step name -> ``steps/<step>.json`` of every step that wrote one (unreadable ones are skipped)."""
    out: dict[str, dict[str, Any]] = {}
    for p in sorted((run / "steps").glob("*.json")):
        sc = load_json(p)
        if isinstance(sc, dict):
            out[p.stem] = sc
    return out


def find_sidecar(sidecars: dict[str, dict[str, Any]], suffix: str) -> tuple[str, dict[str, Any] | None]:
    """The sidecar of the step named ``suffix`` or ``NN_suffix``: (step name, sidecar) or ("", None)."""
    for name, sc in sidecars.items():
        if name == suffix or name.endswith("_" + suffix):
            return name, sc
    return "", None


def record_of(sidecars: dict[str, dict[str, Any]], cls: type[Record]) -> Record | None:
    """The typed record (``runbook.records``) of the step that writes ``cls``, or None when the run has no
    readable one (a run made before records, a step that ended before writing it): the report then reads the
    sidecar's raw data, so such runs still render."""
    _, sc = find_sidecar(sidecars, step_info(cls).package)
    if sc is None:
        return None
    try:
        return record_from_sidecar(sc, cls)
    except RecordError:
        return None


def evidence_file(run: Path, rec: dict[str, Any], rx: re.Pattern) -> Path | None:
    """The first existing evidence file of a check record whose path matches ``rx``."""
    for e in rec.get("evidence", []) or []:
        if rx.search(str(e)) and (run / e).exists():
            return run / e
    return None


def first_evidence(run: Path, rec: dict[str, Any]) -> Path | None:
    """The first existing evidence file of a check record."""
    return next((run / e for e in rec.get("evidence", []) or [] if (run / e).exists()), None)


def data_paths(data: Any, key: str) -> Iterator[str]:
    """Every string stored under ``key`` anywhere in a sidecar's ``data`` (e.g. ``result`` -> the bench's
    ``raw/<step>/bench/result.json``)."""
    if isinstance(data, dict):
        for k, v in data.items():
            if k == key and isinstance(v, str):
                yield v
            else:
                yield from data_paths(v, key)
    elif isinstance(data, list):
        for v in data:
            yield from data_paths(v, key)


def where(exc: BaseException) -> str:
    """``at file.py:line`` of the innermost frame, for a section's note."""
    tb = traceback.extract_tb(exc.__traceback__)
    return f"at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
