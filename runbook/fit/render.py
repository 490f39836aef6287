"""Plain-text rendering of a fit plan (the ``plan`` command's output)."""
from __future__ import annotations

from .budget import Plan, Row, Versus
from .figures import GIB, Figure


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


def _pair(a, b, fmt, unit: str = "") -> str:
    if a is None or b is None:
        return f"{fmt(a) if a is not None else '-'} -> {fmt(b) if b is not None else '-'}{unit}"
    change = f"{b - a:+,.2f}" if isinstance(a, float) and abs(a) < 1e6 else f"{b - a:+,}"
    ratio = f", x{b / a:.2f}" if a else ""
    return f"{fmt(a)} -> {fmt(b)}{unit} ({change}{ratio})"


def versus_text(v: Versus) -> str:
    """``plan``'s comparison with the same recipe on fewer nodes: per-rank weights shrink, the KV pool and the
    context it holds grow."""
    tok = (lambda x: f"{x:,}")
    req = (lambda x: f"{x:,.2f}")
    w = tuple(None if x is None else x / GIB for x in v.weights_per_rank)
    kv = tuple(x / GIB for x in v.kv_pool)
    lines = [f"{v.nodes[1]} nodes against the {v.nodes[0]}-node recipe ({v.base}"
             + ("" if v.same_checkpoint else "; another checkpoint or revision") + "), per rank:",
             "  weights per rank, GiB    " + _pair(w[0], w[1], lambda x: f"{x:,.2f}"),
             "  KV pool per rank, GiB    " + _pair(kv[0], kv[1], lambda x: f"{x:,.2f}")
             + f"  [{v.kv_mode[0]} -> {v.kv_mode[1]}]",
             "  KV tokens per rank       " + _pair(v.kv_tokens[0], v.kv_tokens[1], tok),
             "  MAX_MODEL_LEN            " + _pair(v.max_model_len[0], v.max_model_len[1], tok),
             "  requests of MAX_MODEL_LEN the pool holds at once  "
             + _pair(v.full_requests[0], v.full_requests[1], req),
             "- weights: checkpoint / TP plus what every rank holds whole; KV pool: GPU_MEM_UTIL x MemTotal - weights - "
             "runtime, or KV_CACHE_MEMORY_BYTES when pinned; KV tokens: the pool at the recipe's published bytes per "
             "token (one KV head: every rank keeps a request's whole KV, so the tokens grow with the pool, not with TP)"]
    return "\n".join(lines)
