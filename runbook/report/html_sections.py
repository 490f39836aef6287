"""The measured sections of the run page: network, weights, Engram, launch, benchmark.

Each function returns the section's HTML parts (empty strings are dropped by the page); ``e`` is the
page's escaper (secrets masked, HTML-escaped), ``plots`` whether to embed the PNG plots.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from .html_parts import cell, clip, fmt, img, status_cell, table
from .model import ReportFigure, ReportModel
from .plots import plot_bench, plot_memory, plot_network, plot_readiness, plot_roofline

__all__ = ["FIGURE_HEAD", "figure_rows", "records_table", "not_ran", "network", "weights", "engram", "launch", "bench",
           "roofline"]

Escape = Callable[[Any], str]
FIGURE_HEAD = ["figure", "node", "recomputed", "threshold", "recorded by step", "agrees", "recomputed from"]


def not_ran(model: ReportModel, suffix: str, e: Escape) -> str:
    s = model.step(suffix)
    if s is None or not s.ran:
        return f'<div class="notrun">Step {e(s.name if s else suffix)} did not run in this run.</div>'
    return ""


def figure_rows(figs: list[ReportFigure], e: Escape) -> list[list[str]]:
    """One row per figure: label, node, recomputed, threshold, recorded, agrees, source (FIGURE_HEAD)."""
    out = []
    for f in figs:
        ok = f.consistent
        mark = "–" if ok is None else ("yes" if ok else "NO")
        thr = fmt(f.threshold) if f.threshold is not None else ""
        out.append([f"<td>{e(f.label)}</td>", f"<td>{e(f.node)}</td>", f'<td class="num">{fmt(f.value, f.unit)}</td>',
                    f'<td class="num">{thr}</td>', f'<td class="num">{fmt(f.recorded)}</td>',
                    status_cell("PASS" if ok else "FAIL") if ok is not None else f"<td>{mark}</td>",
                    cell(f.source, e, 60, "small")])
    return out


def network(model: ReportModel, e: Escape, plots: bool) -> list[str]:
    parts = ['<h2 id="network">Network</h2>', not_ran(model, "network", e)]
    net = model.figures_of("network")
    if net:
        if plots:
            parts.append(img(plot_network(net), "bandwidth"))
        parts.append(table(FIGURE_HEAD, figure_rows(net, e)))
    elif model.step("network") and model.step("network").ran:
        parts.append('<p class="muted">No bandwidth or latency figures in the 01 evidence.</p>')
    env_rows = []
    for node, facts in sorted(model.environment.items()):
        for k, v in sorted(facts.items()):
            if k == "command":
                continue
            env_rows.append([f"<td>{e(node)}</td>", f"<td>{e(k)}</td>", cell(v, e, 200)])
    if env_rows:
        parts.append("<h3>Node facts used for drift (00 / 01 / 04 sidecars)</h3>")
        parts.append(table(["node", "fact", "value"], env_rows))
    return parts


def weights(model: ReportModel, e: Escape) -> list[str]:
    parts = ['<h2 id="weights">Weights</h2>', not_ran(model, "weights", e)]
    if model.weights:
        parts.append("<p>" + " · ".join(f"{e(k)} <b>{e(v)}</b>" for k, v in model.weights.items()) + "</p>")
    wf = model.figures_of("weights")
    if wf:
        parts.append(table(FIGURE_HEAD, figure_rows(wf, e)))
    return parts


def engram(model: ReportModel, e: Escape) -> list[str]:
    parts = ['<h2 id="engram">Engram</h2>', not_ran(model, "engram", e)]
    ef = model.figures_of("engram")
    if ef:
        parts.append(table(FIGURE_HEAD, figure_rows(ef, e)))
    elif model.step("engram") and model.step("engram").ran:
        parts.append('<p class="muted">No Engram tool output archived (disabled on this profile, or the step '
                     'stopped before packing; see its checks).</p>')
    return parts


def launch(model: ReportModel, e: Escape, plots: bool) -> list[str]:
    parts = ['<h2 id="launch">Launch</h2>', not_ran(model, "launch", e)]
    L = model.launch
    if not L:
        return parts
    parts.append(f'<p>runtime <b>{e(L.get("runtime"))}</b> · recipe {e(L.get("recipe"))} · fingerprint '
                 f'<code>{e((L.get("fingerprint") or "")[:16])}</code> · API {e(L.get("base_url"))}'
                 f'{" · reused a running server" if L.get("reused") else ""}</p>')
    for r in sorted(L.get("ranks", []), key=lambda r: -(r.get("rank") or 0)):
        parts.append(f"<h3>rank {e(r.get('rank'))} on {e(r.get('node'))}"
                     f"{' (headless)' if r.get('headless') else ''}</h3><pre>{e(r.get('command'))}</pre>")
    if not L.get("ranks"):
        parts.append('<p class="muted">No rendered commands archived (raw/04_launch/rendered.json missing).</p>')
    rf = [f for f in model.figures_of("launch") if f.group == "readiness"]
    if rf:
        parts.append("<h3>Readiness (seconds from launch of the worker rank)</h3>")
        if plots:
            parts.append(img(plot_readiness(L.get("readiness", [])), "readiness"))
        parts.append(table(FIGURE_HEAD, figure_rows(rf, e)))
    mf = [f for f in model.figures_of("launch") if f.group == "memory"]
    if mf:
        guard = L.get("memory_guard") or {}
        breach = guard.get("breach") or {}
        parts.append("<h3>Startup memory: minimum MemAvailable through the start, per rank</h3>")
        if guard:
            parts.append(f'<p class="small">sampled every {e(guard.get("period_s"))} s on every rank; floor '
                         f'{e(guard.get("floor_gib"))} GiB (MEM_FLOOR_GIB), memory PSI full ceiling '
                         f'{e(guard.get("psi_full_max"))} % (MEM_PSI_FULL_MAX); 0 = off'
                         + (f'; <b>the start was aborted</b>: {e(breach.get("node"))} crossed the '
                            f'{e(breach.get("what"))} limit {e(breach.get("t"))} s after launch' if breach else "")
                         + "</p>")
        if plots:
            parts.append(img(plot_memory(L.get("memory_profile") or {}), "startup memory"))
        parts.append(table(FIGURE_HEAD, figure_rows(mf, e)))
    if L.get("capacity"):
        cap = L["capacity"]
        keys = sorted({k for row in cap for k in row})
        parts.append("<h3>Capacity</h3>" + table(keys, [[f"<td>{e(row.get(k))}</td>" for k in keys] for row in cap]))
    return parts


def bench(model: ReportModel, e: Escape, plots: bool) -> list[str]:
    parts = ['<h2 id="bench">Benchmark</h2>', not_ran(model, "bench", e)]
    B = model.bench
    if not B:
        return parts
    parts.append(f'<p>{e(B.get("model"))} @ {e(B.get("base_url"))} · status {e(B.get("status"))} · recipe '
                 f'{e(B.get("recipe"))} · config {e(json.dumps(B.get("config")))}<br><span class="small muted">'
                 f'figures recomputed from {e(B.get("raw"))}; recorded values from {e(B.get("source"))}</span></p>')
    if plots:
        try:
            parts.append(img(plot_bench(model), "benchmark vs published"))
        except Exception as exc:  # noqa: BLE001 - a plot never breaks the page
            parts.append(f'<div class="note">bench plot failed: {e(exc)}</div>')
    rows = []
    for r in B.get("table") or []:
        rows.append([f"<td>{e(r.get('case'))}</td>", status_cell(r.get("status") or "") if r.get("status") else "<td></td>",
                     f"<td>{e(r.get('label'))}</td>", f'<td class="num">{fmt(r.get("median"))}</td>',
                     f'<td class="num">{fmt(r.get("min"))} … {fmt(r.get("max"))}</td>',
                     f'<td class="num">{e(r.get("n"))}</td>', f'<td class="num">{fmt(r.get("published"))}</td>',
                     f'<td class="small" title="{e(r.get("published_source"))}">{e(clip(str(r.get("published_conditions") or ""), 160))}'
                     f'<br><i>{e(clip(str(r.get("published_source") or ""), 60))}</i></td>'])
    if rows:
        parts.append(table(["case", "status", "metric", "median", "min … max", "n", "published",
                            "published conditions / source"], rows))
    for key, title in (("classes", "Workload classes (thinking off and on; never averaged into one figure)"),
                       ("anchors", "Published anchors beside ours (ratio = ours / published, same class and condition)")):
        records = B.get(key) or []
        if records:
            parts.append(f"<h3>{e(title)}</h3>" + records_table(records, e))
    parts += roofline(B, e, plots, model)
    issues = [(c["name"], "FAIL", m) for c in B.get("cases", []) for m in c.get("failures", [])]
    issues += [(c["name"], "WARN", m) for c in B.get("cases", []) for m in c.get("warnings", [])]
    if issues:
        parts.append(table(["case", "", "message"], [[f"<td>{e(a)}</td>", status_cell(b), f"<td>{e(c)}</td>"]
                                                     for a, b, c in issues]))
    bf = model.figures_of("bench")
    if bf:
        parts.append("<details><summary>Recomputation of every benchmark figure</summary>"
                     + table(["case / metric", "recomputed median", "min … max", "n", "recorded (result.json)", "agrees", "from"],
                             [[f"<td>{e(f.group)} / {e(f.label)}</td>", f'<td class="num">{fmt(f.value, f.unit)}</td>',
                               f'<td class="num">{fmt((f.spread or {}).get("min"))} … {fmt((f.spread or {}).get("max"))}</td>',
                               f'<td class="num">{e((f.spread or {}).get("n", ""))}</td>',
                               f'<td class="num">{fmt(f.recorded)}</td>',
                               (status_cell("PASS" if f.consistent else "FAIL") if f.consistent is not None else "<td>–</td>"),
                               cell(f.source, e, 60, "small")] for f in bf]) + "</details>")
    return parts


def records_table(records: list[dict[str, Any]], e: Escape, note_over: int = 40) -> str:
    """A table of flat records: columns empty in every row left out; a text column with values longer than
    ``note_over`` characters (sources, conditions) shows footnote numbers, each text once under the table."""
    cols = [c for c in dict.fromkeys(k for r in records for k in r)
            if any(r.get(c) not in (None, "", [], {}) for r in records)]
    noted = {c for c in cols if any(isinstance(r.get(c), str) and len(r[c]) > note_over for r in records)}
    notes: dict[str, int] = {}

    def td(r: dict[str, Any], c: str) -> str:
        v = r.get(c)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return f'<td class="num">{fmt(v)}</td>'
        if c in noted and v not in (None, ""):
            return f'<td class="small" title="{e(v)}">[{notes.setdefault(str(v), len(notes) + 1)}]</td>'
        text = "" if v is None else str(v)          # metric names break after an underscore
        hover = f' title="{e(text)}"' if len(text) > 60 else ""
        return f"<td{hover}>{e(clip(text, 60)).replace('_', '_<wbr>')}</td>"
    rows = [[td(r, c) for c in cols] for r in records]
    foot = "".join(f"<li>{e(text)}</li>" for text in notes)
    return ('<div class="small">' + table([c.replace("_", " ") + (" [n]" if c in noted else "") for c in cols], rows)
            + (f'<ol class="notes">{foot}</ol>' if foot else "") + "</div>")


def _mb(v: Any) -> str:
    return "–" if v is None else f"{v / 1e6:,.2f} MB"


def roofline(B: dict[str, Any], e: Escape, plots: bool, model: ReportModel) -> list[str]:
    """The memory bandwidth per rank (before and after), the roofline panel (measured/ceiling per class
    and thinking mode, with its plot) and the protocol reconciliation of the cross-check."""
    parts: list[str] = []
    mb = B.get("membw") or {}
    if mb:
        nodes = sorted({n for ph in ("before", "after") for n in (mb.get(ph) or {})})
        cell = lambda r: (f'<td class="num">{r["gbs"]:.1f} GB/s</td>' if r.get("gbs") and not r.get("error")
                          else f"<td>{e(r.get('error', '–'))}</td>")
        rows = [[f"<td>{e(n)}</td>", cell((mb.get("before") or {}).get(n, {})), cell((mb.get("after") or {}).get(n, {})),
                 f"<td class=\"small\">{e(((mb.get('before') or {}).get(n) or {}).get('label', ''))}</td>"] for n in nodes]
        valid = mb.get("valid")
        verdict = ("valid" if valid else "INVALID: a rank fell below 80 % of another") if valid is not None else "not judged"
        parts.append(f"<h3>Memory bandwidth per rank (bench {e(verdict)})</h3>"
                     + table(["node", "before the bench", "after the bench", "probe"], rows))
    roof = B.get("roofline") or {}
    if roof.get("step"):
        step = roof["step"]
        lines = [f"weights per rank {_mb(roof.get('weights_per_rank'))} + KV/indexer at context {roof.get('context')} "
                 f"{_mb(roof.get('kv_per_rank'))} = {_mb(roof.get('plain_bytes_per_rank'))} per plain step at TP={roof.get('tp')}"
                 + (f" x PP={roof.get('pp')} (a rank reads its stage's layers; a token passes all {roof.get('pp')} stages)"
                    if int(roof.get("pp") or 1) > 1 else "")
                 + (f"; a verify step (k={roof.get('spec_k')}) {_mb(roof.get('verify_bytes_per_rank'))}" if roof.get("spec_k") else ""),
                 "by part (whole model, per token): " + ", ".join(f"{k} {_mb(v)}" for k, v in (step.get("parts") or {}).items() if v),
                 f"bytes from: {step.get('source')}" + ("; " + "; ".join(step.get("assumptions") or []) if step.get("assumptions") else ""),
                 f"bandwidth: {roof.get('bandwidth_note')}",
                 f"collectives: {roof.get('allreduces')} all-reduces per step x {(roof.get('allreduce_s') or 0) * 1e6:.0f} us "
                 f"({roof.get('allreduce_note')})"]
        parts.append("<h3>Roofline: how close to the memory-bandwidth limit</h3><p class=\"small\">"
                     + "<br>".join(e(x) for x in lines) + "</p>")
        if plots:
            try:
                parts.append(img(plot_roofline(model), "measured over ceiling per class"))
            except Exception as exc:  # noqa: BLE001 - a plot never breaks the page
                parts.append(f'<div class="note">roofline plot failed: {e(exc)}</div>')
        cols = ["class", "thinking", "context", "decode_tok_s", "tokens_per_step", "ms_per_step", "steps", "accepted",
                "ceiling_plain_tok_s", "ceiling_tok_s", "ceiling_ms_per_step", "measured_over_ceiling", "published"]
        rows = [[f'<td class="num">{e(fmt(r.get(c)))}</td>' if isinstance(r.get(c), float) else f"<td>{e(r.get(c))}</td>"
                 for c in cols] for r in roof.get("rows") or []]
        if rows:
            parts.append(table(["class", "thinking", "context", "decode tok/s", "tokens/step", "ms/step", "steps (Δ drafts)",
                                "accepted (Δ)", "ceiling plain tok/s", "ceiling at acceptance tok/s", "ceiling ms/step",
                                "measured / ceiling", "published (same class)"], rows))
    ranks = roof.get("rank_rows") or []
    if ranks:
        num = lambda v, f: f'<td class="num">{e(f.format(v))}</td>' if isinstance(v, (int, float)) else "<td>–</td>"
        staged = any(int(r.get("pp") or 1) > 1 for r in ranks)
        where = (lambda r: [f"<td>{e(r.get('stage', 0))}</td>", f"<td>{e(r.get('tp_rank', r['rank']))}</td>"]
                 if staged else [])
        rows = [[f"<td>{e(r['rank'])}</td>", f"<td>{e(r['node'])}</td>", *where(r), num(r.get("bandwidth_gbs"), "{:.1f}"),
                 num((r.get("bytes_per_rank") or 0) / 1e6, "{:,.1f}"), num(r.get("read_ms"), "{:.2f}"),
                 num(r.get("allreduce_us"), "{:.0f}"), num(r.get("allreduces"), "{}"),
                 num(r.get("collectives_ms"), "{:.2f}"), num(r.get("step_ms"), "{:.2f}"), num(r.get("tok_s"), "{:.1f}"),
                 f"<td>{('binds stage ' + str(r.get('stage', 0))) if staged and r.get('binds') else 'binds' if r.get('binds') else ''}</td>"]
                for r in ranks]
        pp = max(int(r.get("pp") or 1) for r in ranks)
        stages = (f"; {pp} pipeline stages of TP={e(roof.get('tp'))} (rank = stage x TP + TP rank): a token passes "
                  f"every stage in turn, so step ms is PP x the rank's stage plus {pp - 1} hand-off(s), and the "
                  "slowest rank of each stage sets that stage" if staged else "; the slowest rank sets the step")
        parts.append(f"<h3>Roofline per rank ({len(ranks)} ranks; the all-reduce spans TP={e(roof.get('tp'))}: "
                     f"{'measured across the nodes by 01_network' if roof.get('allreduce_measured') else 'the two-rank figure scaled to the TP group'}"
                     f"{stages})</h3>"
                     + table(["rank", "node", *(["stage", "TP rank"] if staged else []), "bandwidth GB/s",
                              "MB per plain step", "read ms", "all-reduce us",
                              "all-reduces", "collectives ms", "step ms", "ceiling tok/s", ""], rows))
    rec = B.get("reconciliation") or {}
    if rec.get("rows"):
        rows = []
        for r in rec["rows"]:
            causes = "<br>".join(e(f"{c['cause']}: " + (f"{c['estimate']:+.2f}; " if c.get("estimate") is not None else "")
                                   + c.get("note", "")) for c in r.get("causes", []))
            rows.append([f"<td>{e(r['figure'])}</td>", f'<td class="num">{e(fmt(r.get("harness")))}</td>',
                         f'<td class="num">{e(fmt(r.get("vllm")))}</td>', f'<td class="num">{e(fmt(r.get("delta")))}</td>',
                         f'<td class="num">{e(fmt(r.get("explained")))}</td>', f'<td class="num">{e(fmt(r.get("residual")))}</td>',
                         f'<td class="small">{causes}<br><i>harness: {e(r.get("harness_definition"))}; vLLM: '
                         f'{e(r.get("vllm_definition"))}</i></td>'])
        parts.append(f"<h3>Protocol reconciliation: this harness vs vllm bench serve ({e(rec.get('case'))}, seed "
                     f"{e(rec.get('seed'))})</h3>" + table(["figure", "harness", "vllm bench serve", "delta (vLLM - harness)",
                                                          "explained", "residual", "causes"], rows))
    return parts
