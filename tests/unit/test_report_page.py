"""The report reads like a page: the verdict as a headline with a short list of reasons, a "Next" section
(the first failing row's fix and the resume command, or the comparison to look at), long cells shortened
with the full text on hover. Run folders from ``tests/support/runs.py`` (the real file formats)."""
from __future__ import annotations

import html
import json
import re

from runbook.report import collector, html_page
from runbook.report.nextstep import REASONS_SHOWN, resume_command, what_next
from runbook.secrets import Redactor
from support.runs import API, build_run, chk, edit_sidecar

RED = Redactor([API])


def page_of(run, **kw) -> tuple[str, object]:
    model = collector.collect(run, redactor=RED, **kw)
    return html_page.render_html(model, redactor=RED, plots=False), model


def fail_check(run, step: str, name: str, fix: str, observed: str = "seen") -> None:
    """Turn the check ``name`` of ``step`` into a FAIL with ``fix``; the step and the run fail with it."""
    def change(sc):
        c = next(c for c in sc["checks"] if c["name"] == name)
        c.update(status="FAIL", observed=observed, expected="wanted", fix=fix)
        sc["status"] = "failed"
    edit_sidecar(run, step, change)
    man = json.loads((run / "manifest.json").read_text())
    man["status"] = "failed"
    man["steps"][step].update(status="failed", error=f"checks failed: {name}")
    (run / "manifest.json").write_text(json.dumps(man))


def section(page: str, start: str, end: str) -> str:
    return page.split(start, 1)[1].split(end, 1)[0]


def test_a_failed_run_says_where_it_failed_first_and_next_names_the_first_failing_rows_fix(tmp_path):
    run = build_run(tmp_path / "results", "20261201-040000-lab")
    first = json.loads((run / "steps/01_network.json").read_text())["checks"][0]["name"]
    later = json.loads((run / "steps/04_launch.json").read_text())["checks"][0]["name"]
    fail_check(run, "04_launch", later, fix="restart the worker rank")
    fail_check(run, "01_network", first, fix="set MTU 9000 on the fabric port")
    page, model = page_of(run)
    body = page.split("<body>", 1)[1]
    assert body.startswith('<div class="verdict" style="background:#f8d7da">')       # failed: red, not the verdict's
    assert "<h1>Candidate: the run failed at 01_network (Network)</h1>" in body
    top = section(body, "<ul>", "</ul>")
    assert top.startswith(f"<li>01_network failed: 1 check(s) FAIL — checks failed: {html.escape(first)}</li>")
    nxt = section(body, '<div class="next" id="next">', "</div>")
    assert f"Fix 01_network · check “{html.escape(first)}”" in nxt          # the first in step order, not 04's
    assert "Fix: set MTU 9000 on the fabric port" in nxt and "restart the worker rank" not in nxt
    assert f"<pre>python -m runbook run --profile env/lab.env --resume {run.name}</pre>" in nxt
    assert body.index('id="next"') < body.index('id="steps"')                 # before every table


def test_a_step_that_failed_without_a_failing_check_gives_its_error(tmp_path):
    run = build_run(tmp_path / "results", "20261201-040000-lab")
    (run / "steps/04_launch.json").unlink()              # died before writing its sidecar
    man = json.loads((run / "manifest.json").read_text())
    man["status"] = "failed"
    man["steps"]["04_launch"].update(status="failed", error="RemoteError: ssh worker: connection refused\ntrace…")
    (run / "manifest.json").write_text(json.dumps(man))
    _, model = page_of(run)
    n = what_next(model)
    assert n.kind == "fix" and n.title == "Fix 04_launch (Launch): the step failed"
    assert n.detail == "RemoteError: ssh worker: connection refused"
    assert n.command == resume_command(model) == f"python -m runbook run --profile env/lab.env --resume {run.name}"


def test_a_passed_run_points_at_the_drift_when_figures_moved(tmp_path):
    root = tmp_path / "results"
    build_run(root, "20261201-030000-lab", created="2026-12-01T03:00:00+00:00")
    cur = build_run(root, "20261201-040000-lab", created="2026-12-01T04:00:00+00:00", tcp=(4.0, 7.70))
    page, model = page_of(cur, results_root=root)
    n = what_next(model)
    assert model.drift.items and n.kind == "compare" and n.anchor == "drift" and n.command == ""
    assert n.title == f"Compare with 20261201-030000-lab: {model.drift.summary()}"
    nxt = section(page, '<div class="next" id="next">', "</div>")
    assert html.escape(n.title) in nxt and '<a href="#drift">' in nxt and "<pre>" not in nxt


def test_the_first_good_run_is_the_baseline(tmp_path):
    run = build_run(tmp_path / "results", "20261201-040000-lab")
    _, model = page_of(run)
    n = what_next(model)
    assert n.kind == "compare" and n.title.startswith("Nothing failed: this run is the baseline")
    assert "no previous good run" in n.detail


def test_the_headline_lists_a_few_reasons_and_counts_the_rest(tmp_path):
    run = build_run(tmp_path / "results", "20261201-040000-lab")
    page, model = page_of(run)
    missing = model.verdict.missing
    assert len(missing) > REASONS_SHOWN                  # the lab run misses most requirements
    items = re.findall(r"<li[^>]*>(.*?)</li>", section(page, "<h1>", "</ul>"))
    assert len(items) == REASONS_SHOWN + 1
    assert items[-1] == f"… and {len(missing) - REASONS_SHOWN} more (Verdict requirements below)"


def test_a_long_cell_is_shortened_with_the_full_text_on_hover_and_secrets_masked(tmp_path):
    run = build_run(tmp_path / "results", "20261201-040000-lab")
    long = "/".join(f"segment{i:03d}" for i in range(40)) + f"?key={API}"        # 440 characters, no space
    edit_sidecar(run, "00_preflight", lambda sc: sc["checks"].append(chk("long observation", observed=long)))
    page, _ = page_of(run)
    row = next(r for r in page.split("<tr>") if "<td>long observation</td>" in r)
    cell = re.search(r'<td class="long" title="([^"]*)">([^<]*)</td>', row)
    assert cell, row
    assert html.unescape(cell.group(1)) == long.replace(API, "***")           # full text, masked
    shown = html.unescape(cell.group(2))
    assert len(shown) == 200 and shown.endswith("…") and long.startswith(shown[:-1])
    assert API not in page


def test_a_rehearsals_resume_command_rehearses_again(tmp_path):
    from runbook.lab import rehearsal
    profile, _, subs = rehearsal.load_rehearsal("env/dspark-v4.env")
    run = build_run(tmp_path / "results", "20261201-040000-dspark-v4")
    (run / "rehearsal.json").write_text(json.dumps(rehearsal.record(profile, [s.to_dict() for s in subs])))
    first = json.loads((run / "steps/02_weights.json").read_text())["checks"][0]["name"]
    fail_check(run, "02_weights", first, fix="free space on the head")
    _, model = page_of(run)
    assert model.rehearsal and what_next(model).command == \
        f"python -m runbook run --profile env/lab.env --resume {run.name} --rehearse"


def test_the_api_gone_outranks_the_missing_endpoint_it_explains(tmp_path):
    """The field case of issue 37: the head's API killed under a step; the step's own row says /tokenize must be
    served (07 in the field; any step here), the runner's explanation rows say the API is gone. The first fix is the server's, in the report and
    on the console alike (one function decides)."""
    run = build_run(tmp_path / "results", "20261201-040000-lab")
    own = json.loads((run / "steps/04_launch.json").read_text())["checks"][0]["name"]
    fail_check(run, "04_launch", own, fix="the server must serve POST /tokenize (vLLM does)")

    def explained(sc):
        sc["checks"].append({**chk("server answers /health", status="FAIL", observed="connection refused",
                                   fix="the API is gone: read the logs; restart with 04_launch"), "cause": "server"})
    edit_sidecar(run, "04_launch", explained)
    _, model = page_of(run)
    n = what_next(model)
    assert n.title == "Fix 04_launch · check “server answers /health” on head"
    assert n.fix.startswith("the API is gone")

    from runbook.checks import Check, Status
    from runbook.console import Console
    import io
    console = Console(file=io.StringIO())
    rows = [Check.from_record(c) for c in json.loads((run / "steps/04_launch.json").read_text())["checks"]]
    assert [r.name for r in rows if r.status is Status.FAIL] == [own, "server answers /health"]
    console.failing.append(("04_launch", rows))
    assert console.first_fix_text().startswith("first fix (04_launch · server answers /health on head): the API is gone")


def test_a_cause_outside_the_vocabulary_is_refused():
    import pytest
    from runbook.checks import check
    with pytest.raises(ValueError, match="cause 'gpu'"):
        check("x", False, cause="gpu")
    assert "cause" not in check("x", False).to_record()         # ordinary rows keep their record shape
    assert check("x", False, cause="node").to_record()["cause"] == "node"
