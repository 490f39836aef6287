"""The run page: one self-contained HTML document rendered from a ``ReportModel`` (pure; plots embedded).

Order: the verdict as a headline with its short reasons (every requirement folded below), "Next" (the first
failing row's fix and the resume command, or the comparison to look at), header (status, check counts,
provenance line), notes, steps, check matrix, drift, the measured
sections (:mod:`.html_sections`), all figures, profile, provenance. The whole page passes through the
redactor before it is returned.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from ..site import count, count_text
from ..secrets import Redactor, default_redactor
from . import html_sections as sections
from .html_parts import COLOURS, CSS, cell, clip, escaper, fmt, status_cell, table
from .model import ReportModel
from .nextstep import headline_text, reasons, what_next

__all__ = ["render_html", "render_drift", "verdict_headline", "next_section"]

Escape = Callable[[Any], str]
NEXT_TITLE = "Next"        # the section that says what to run now (08's narrative names it)
NAV = [("steps", "Steps"), ("matrix", "Checks"), ("drift", "Drift"), ("network", "Network"),
       ("weights", "Weights"), ("engram", "Engram"), ("launch", "Launch"), ("bench", "Benchmark"),
       ("figures", "All figures"), ("profile", "Profile"), ("provenance", "Provenance")]


def render_html(model: ReportModel, *, redactor: Redactor | None = None, plots: bool = True) -> str:
    """The report page (pure function of the model; plots rendered here and embedded as data: URIs)."""
    red = redactor or default_redactor()
    e = escaper(red)
    parts = (verdict_headline(model, e) + next_section(model, e) + header(model, e) + substitutions(model, e) + steps(model, e) + matrix(model, e)
             + ['<h2 id="drift">Drift from the previous good run</h2>', render_drift(model, e)]
             + sections.network(model, e, plots) + sections.weights(model, e) + sections.engram(model, e)
             + sections.launch(model, e, plots) + sections.bench(model, e, plots)
             + [f'<div class="notrun">Step {e(s.name)} ({e(s.title)}) did not run in this run.</div>'
                for s in (model.step("smoke"), model.step("vision_tools")) if s is not None and not s.ran]
             + all_figures(model, e) + profile(model, e) + provenance(model, e))
    body = "\n".join(p for p in parts if p)
    page = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>Run report {e(model.run_id)}</title><style>{CSS}</style></head><body>{body}"
            f"<p class=\"small muted\">spark-runbook report · {e(model.generated)}</p></body></html>\n")
    return red.redact(page)


def verdict_headline(model: ReportModel, e: Escape) -> list[str]:
    """The page's top: the verdict as a headline, its short reasons, then every requirement (folded)."""
    v = model.verdict
    failed = any(s.ran and s.status not in ("passed", "not run", "") for s in model.steps)
    colour = COLOURS["failed"] if failed else COLOURS.get(v.verdict if v is not None else "", "#eee")
    items = "".join(f'<li title="{e(full)}">{e(shown)}</li>' if shown != full else f"<li>{e(shown)}</li>"
                    for shown, full in reasons(model))
    out = [f'<div class="verdict" style="background:{colour}"><div class="small">Run report · {e(model.run_id)} · '
           f'profile {e(model.profile_name)}</div><h1>{e(headline_text(model))}</h1>'
           + (f"<ul>{items}</ul>" if items else "") + "</div>"]
    if v is not None:
        rows = [[f"<td>{e(item.split(': ', 1)[0])}</td>", status_cell("PASS" if ok else "N/A"),
                 f'<td class="wrap">{e(item.split(": ", 1)[-1])}</td>']
                for ok, items in ((False, v.missing), (True, v.met)) for item in items]
        out.append('<details><summary>Verdict requirements (validated only when every one is met)</summary>'
                   + table(["requirement", "met", "evidence / what is missing"], rows) + "</details>")
    return out


def next_section(model: ReportModel, e: Escape) -> list[str]:
    """What to run now: the first failing row's fix and the resume command, or the comparison to look at."""
    n = what_next(model)
    body = [f'<p><b>{e(n.title)}</b>' + (f' — <a href="#{n.anchor}">see below</a>' if n.anchor else "") + "</p>"]
    if n.detail:
        body.append(f'<p class="small">{e(clip(n.detail, 400))}</p>')
    if n.fix:
        body.append(f"<p>Fix: {e(n.fix)}</p>")
    if n.command:
        body.append(f'<p class="small">then continue the run (its passed steps are skipped):</p><pre>{e(n.command)}</pre>')
    return [f'<div class="next" id="next"><h2 style="margin-top:4px">{NEXT_TITLE}</h2>' + "".join(body) + "</div>"]


def header(model: ReportModel, e: Escape) -> list[str]:
    st = model.status
    git = (model.provenance or {}).get("git") or {}
    parts = []
    parts.append(
        f'<p><span class="badge" style="background:{COLOURS.get(st, "#eee")}">run {e(st)}</span>'
        + "".join(f'<span class="badge" style="background:{COLOURS.get(k, "#eee")}">{e(k)} {v}</span>'
                  for k, v in model.counts().items() if v)
        + f'</p><p class="small muted">profile <b>{e(model.profile_name)}</b> (recipe {e(model.profile.get("RECIPE", "?"))}, '
          f'{e(model.manifest.get("profile_source", ""))}) · created {e(model.manifest.get("created", "?"))} · '
          f'mode {e(model.manifest.get("mode", "?"))}{" · DRY RUN" if model.manifest.get("dry_run") else ""} · '
          f'git {e((git.get("sha") or "?")[:12])}{" (dirty)" if git.get("dirty") else ""} · report generated '
          f'{e(model.generated)} from the files of {e(model.run_path)}; every number below is recomputed from '
          f'the run folder (sidecars, raw tool output, JSONL), none is copied from notebook text.</p>')
    parts.append("<nav>" + "".join(f'<a href="#{a}">{t}</a>' for a, t in NAV) + "</nav>")
    parts += [f'<div class="note">{e(n)}</div>' for n in model.notes]
    return parts


def steps(model: ReportModel, e: Escape) -> list[str]:
    rows = []
    for s in model.steps:
        c = s.counts or {}
        rows.append([f"<td>{e(s.name)}</td>", f"<td>{e(s.title)}</td>", status_cell(s.status or "?"),
                     f'<td class="num">{fmt(s.seconds, "s")}</td>',
                     "<td>" + " ".join(f"{e(k)}&nbsp;{v}" for k, v in c.items() if v) + "</td>",
                     cell(s.error, e, 200, "small")])
    return ['<h2 id="steps">Steps</h2>', table(["step", "title", "status", "duration", "checks", "error"], rows)]


def matrix(model: ReportModel, e: Escape) -> list[str]:
    parts = ['<h2 id="matrix">Check matrix</h2><p class="small muted">Every check of every step, '
             'from <code>steps/&lt;step&gt;.json</code>.</p>']
    for s in model.steps:
        if not s.ran:
            continue
        if not s.checks:
            parts.append(f'<h3>{e(s.name)} · {e(s.title)}</h3><div class="notrun">'
                         + ("no sidecar: the step did not finish (see its error above)" if not s.has_sidecar
                            else "the step recorded no checks") + "</div>")
            continue
        summary = ", ".join(f"{k} {v}" for k, v in s.counts.items() if v)
        rows = [[f"<td>{e(c.name)}</td>", f"<td>{e(c.node)}</td>", status_cell(c.status),
                 cell(c.observed, e, 200), cell(c.expected, e, 200), f'<td class="small">{e(c.fix)}</td>']
                for c in s.checks]
        parts.append(f"<details open><summary>{e(s.name)} · {e(s.title)} — {e(summary)}</summary>"
                     + table(["check", "node", "status", "observed", "expected", "fix"], rows) + "</details>")
    not_run = [s.name for s in model.steps if not s.ran]
    if not_run:
        parts.append(f'<div class="notrun">Not run in this run: {e(", ".join(not_run))}</div>')
    return parts


def render_drift(model: ReportModel, e: Escape) -> str:
    d = model.drift
    if d is None:
        return '<div class="notrun">Drift was not computed.</div>'
    if d.previous_run_id is None:
        return f'<div class="notrun">{e(d.reason or "no previous good run")}</div>'
    out = [f'<p>Compared with <b>{e(d.previous_run_id)}</b> (the latest earlier run of profile '
           f'{e(model.profile_name)} whose manifest status is <i>passed</i>). Figures: moved when outside the '
           f'benchmark spread (min…max of both runs do not overlap) or, without a spread, when they change by more '
           f'than {d.rel_tol:.0%}. {e(d.summary())}.</p>']
    if d.not_compared:
        out.append(f'<p class="small muted">Not compared (step ran in only one of the two runs): '
                   f'{e(", ".join(d.not_compared))}</p>')
    if not d.items:
        out.append('<p>No drift.</p>')
        return "".join(out)
    rows = []
    for it in d.items:
        colour = {"worse": "FAIL", "better": "PASS", "changed": "WARN"}.get(it.direction, "WARN")
        rows.append([f"<td>{e(it.kind)}</td>", f"<td>{e(it.key)}</td>", cell(it.previous, e, 80, "wrap"),
                     cell(it.current, e, 80, "wrap"), status_cell(colour).replace(f">{colour}<", f">{e(it.direction)}<"),
                     f'<td class="small">{e(it.detail)}</td>'])
    out.append(table(["kind", "what", f"previous ({d.previous_run_id})", "this run", "", "detail"], rows))
    return "".join(out)


def all_figures(model: ReportModel, e: Escape) -> list[str]:
    parts = ['<h2 id="figures">All figures and their recomputation</h2>']
    bad = model.inconsistent()
    if bad:
        parts.append(f'<div class="note">{len(bad)} figure(s) disagree with what their step recorded: '
                     f'{e(", ".join(f.key for f in bad))}</div>')
    other = [f for f in model.figures if not f.step.endswith("bench")]
    parts.append(table(["key"] + sections.FIGURE_HEAD[1:],
                       [[f"<td class='small'>{e(f.key)}</td>"] + sections.figure_rows([f], e)[0][1:] for f in other])
                 if other else '<p class="muted">No figures.</p>')
    return parts


def substitutions(model: ReportModel, e: Escape) -> list[str]:
    """A rehearsal's substituted keys by class: *hardware* (what the lab cannot have) and *lab* (what it still
    changes, by goal group), with the counts (``site.count``, the one count); the run's mode; nothing for a
    run that is not a rehearsal."""
    if not model.rehearsal:
        return []
    subs = model.rehearsal.get("substituted") or []
    counts = count_text(count(subs))
    rows = [[f"<td>{e(sub.get('kind') or 'unclassified')}</td>", f"<td>{e(sub.get('goal') or '')}</td>",
             f"<td>{e(sub.get('key'))}{e(' (' + sub['part'] + ')' if sub.get('part') else '')}</td>",
             cell(sub.get("recipe"), e, 60), cell(sub.get("lab"), e, 60),
             f"<td class='small'>{e(sub.get('group'))}: {e(sub.get('why'))}</td>"]
            for sub in sorted(subs, key=lambda s: (str(s.get("kind") or "unclassified"), str(s.get("goal") or "")))]
    mode = model.rehearsal.get("mode") or {}
    mode_line = ([f"<p>Mode: {e(', '.join(f'{k}={v}' for k, v in (mode.get('keys') or {}).items()))}: "
                  f"{e(mode.get('why') or '')}; not counted as substitutions.</p>"] if mode else [])
    tools = model.rehearsal.get("tools") or {}
    tool_rows = [[f"<td>{e(kind)}</td>", f"<td>{e(name)}</td>", f"<td class='small'>{e(why)}</td>"]
                 for kind in ("simulated", "real") for name, why in (tools.get(kind) or {}).items()]
    return [f'<h2 id="rehearsal">Rehearsal substitutions</h2><p>{len(subs)} key(s) substituted ({e(counts)}); '
            "every other key of the recipe profile ran as written.</p>", *mode_line,
            "<details><summary>every substituted key</summary>"
            + table(["class", "goal group", "key", "recipe", "rehearsal", "why"], rows) + "</details>"] + (
            [f"<p>Tools: {len(tools.get('simulated') or {})} simulated (hardware: "
             f"{e(', '.join(tools.get('simulated') or {}))}), the rest real "
             f"({e(', '.join(tools.get('real') or {}))}).</p>",
             "<details><summary>simulated and real tools</summary>" + table(["", "tool", "why"], tool_rows)
             + "</details>"] if tools else [])


def profile(model: ReportModel, e: Escape) -> list[str]:
    rows = [[f"<td>{e(k)}</td>", cell(json.dumps(v) if not isinstance(v, str) else v, e, 160)]
            for k, v in model.profile.items()]
    return ['<h2 id="profile">Profile</h2><p class="small muted">profile.json of the run (secrets masked).</p>',
            "<details><summary>all keys</summary>" + table(["key", "value"], rows) + "</details>"]


def provenance(model: ReportModel, e: Escape) -> list[str]:
    prov = model.provenance or {}
    git = prov.get("git") or {}
    items = ([("git", json.dumps(git)), ("python", prov.get("python")), ("host", json.dumps(prov.get("host")))]
             + [(f"package {k}", v) for k, v in (prov.get("packages") or {}).items()])
    return ['<h2 id="provenance">Provenance</h2>',
            table(["item", "value"], [[f"<td>{e(k)}</td>", cell(v, e, 300)] for k, v in items])]
