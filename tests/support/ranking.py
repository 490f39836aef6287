"""What diagnose names for a text, as the catalogue tests read it: the ranked (id, confidence) pairs, and the first
match (a test that expects a name fails with the text when nothing matched)."""
from __future__ import annotations

from runbook.diagnose.offline import diagnose_text


def ranked(text: str) -> list[tuple[str, str]]:
    return [(r.id, r.confidence) for r in diagnose_text(text)]


def first(text: str):
    matches = diagnose_text(text)
    assert matches, f"nothing named for: {text[:120]!r}"
    return matches[0]
