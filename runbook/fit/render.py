"""Plain-text rendering of a fit plan (the ``plan`` command's output)."""
from __future__ import annotations

from .budget import Plan, Row
from .figures import Figure


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def plan_text(p: Plan) -> str:
    head = [f"fit plan: {p.profile} -- {p.verdict}", f"node facts: {p.origin}"]
    if p.knobs():
        head.append("knobs to turn: " + ", ".join(p.knobs()))
    cols = ("check", "node", "need", "have", "headroom", "status", "knob")
    table = [cols] + [(r.name, r.node, r.fmt(r.need), r.fmt(r.have), r.fmt(r.headroom), r.status.value, r.knob)
                      for r in p.rows]
    widths = [min(52, max(len(_clip(row[i], 52)) for row in table)) for i in range(len(cols))]
    lines = ["  ".join(_clip(v, w).ljust(w) for v, w in zip(row, widths)).rstrip() for row in table]
    body = ["", *lines, "", "how each row is computed ([source] of every figure):"]
    for r in p.rows:
        body.append(f"- {r.name} @ {r.node}: {r.detail}")
        if r.fix:
            body.append(f"    fix ({r.knob}): {r.fix}")
    body += ["", "sources: profile = the profile's keys; measured = read on the node; published = a seed "
                 "recipe or its operators; nominal = spec sheet or the runbook's allowance; derived = computed."]
    notes = _notes(p.rows)
    if notes:
        body += ["", "figures:"] + [f"- [{f.source}] {label}: {f.note}" for label, f in notes]
    return "\n".join(head + body)


def _notes(rows: list[Row]) -> list[tuple[str, Figure]]:
    """Every non-profile input figure once, with its note (where it comes from)."""
    seen: dict[str, tuple[str, Figure]] = {}
    for r in rows:
        for label, f in r.terms + ([(f"{r.name}: have", r.have_figure)] if r.have_figure else []):
            if f.note and f.source != "profile" and f.note not in seen:
                seen[f.note] = (label, f)
    return list(seen.values())
