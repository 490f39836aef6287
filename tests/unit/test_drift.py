"""Run-to-run drift: previous good run selection, status changes, moved figures, changed environment."""
from __future__ import annotations

import json

from runbook.evidence import previous_good_run
from runbook.report import drift
from runbook.report.checks import report_checks
from runbook.report.collector import collect
from runbook.report.html_page import render_html
from runbook.report.model import ReportFigure, ReportModel, StepInfo
from runbook.secrets import Redactor
from support.runs import build_run

RED = Redactor()


def test_previous_good_run_is_the_latest_earlier_passed_run_of_the_same_profile(tmp_path):
    root = tmp_path / "results"
    good_old = build_run(root, "20261201-010000-lab", created="2026-12-01T01:00:00+00:00", steps=("00_preflight",))
    good = build_run(root, "20261201-020000-lab", created="2026-12-01T02:00:00+00:00", steps=("00_preflight",))
    build_run(root, "20261201-030000-lab", created="2026-12-01T03:00:00+00:00", status="failed", steps=("00_preflight",))
    build_run(root, "20261201-033000-spark", created="2026-12-01T03:30:00+00:00", profile="spark", steps=("00_preflight",))
    cur = build_run(root, "20261201-040000-lab", created="2026-12-01T04:00:00+00:00", steps=("00_preflight",))
    build_run(root, "20261201-050000-lab", created="2026-12-01T05:00:00+00:00", steps=("00_preflight",))  # later
    assert previous_good_run(cur, root) == good.resolve()
    assert previous_good_run(good, root) == good_old.resolve()
    assert previous_good_run(good_old, root) is None


def test_drift_detects_status_change_moved_figure_and_changed_kernel(tmp_path):
    root = tmp_path / "results"
    build_run(root, "20261201-030000-lab", created="2026-12-01T03:00:00+00:00")
    cur = build_run(root, "20261201-040000-lab", created="2026-12-01T04:00:00+00:00",
                    gpu_status="FAIL", tcp=(4.0, 7.70), kernel="6.19.1", command_flag="--max-model-len 8192")
    model = collect(cur, results_root=root, redactor=RED)
    d = model.drift
    assert d.previous_run_id == "20261201-030000-lab"
    status = {i.key: i for i in d.of_kind("status")}
    assert status["00_preflight: GPU present @ head"].previous == "N/A"
    assert status["00_preflight: GPU present @ head"].current == "FAIL"
    assert status["00_preflight: GPU present @ head"].direction == "worse"
    figs = {i.key: i for i in d.of_kind("figure")}
    assert "01_network/net.tcp.rail0.head->worker" in figs and figs["01_network/net.tcp.rail0.head->worker"].direction == "worse"
    assert "01_network/net.tcp.rail0.worker->head" not in figs        # 7.765 -> 7.70 is within 20 %
    env = {i.key: i for i in d.of_kind("environment")}
    assert env["head: kernel"].previous == "6.18.44" and env["head: kernel"].current == "6.19.1"
    assert env["worker: kernel"].current == "6.19.1"
    assert "head: command" in env and "8192" in env["head: command"].detail
    # the report shows the section and the step's check says WARN
    page = render_html(model, redactor=RED)
    assert "Compared with <b>20261201-030000-lab</b>" in page and "6.19.1" in page
    rec = {c.name: c for c in report_checks(model)}
    assert rec["drift"].status.value == "WARN"


def test_identical_runs_show_no_drift(tmp_path):
    root = tmp_path / "results"
    build_run(root, "20261201-030000-lab", created="2026-12-01T03:00:00+00:00")
    cur = build_run(root, "20261201-040000-lab", created="2026-12-01T04:00:00+00:00")
    d = collect(cur, results_root=root, redactor=RED).drift
    assert d.items == [] and d.compared_figures > 10 and d.compared_checks > 10
    assert not d.significant


def test_tolerance_is_configurable(tmp_path):
    root = tmp_path / "results"
    build_run(root, "20261201-030000-lab", created="2026-12-01T03:00:00+00:00")
    cur = build_run(root, "20261201-040000-lab", created="2026-12-01T04:00:00+00:00", tcp=(9.133 * 0.9, 7.765))
    assert not collect(cur, results_root=root, redactor=RED).drift.of_kind("figure")
    moved = collect(cur, results_root=root, redactor=RED, rel_tol=0.05).drift.of_kind("figure")
    assert [i.key for i in moved] == ["01_network/net.tcp.rail0.head->worker"]


def _bench_figure(key, value, lo, hi, n=3):
    return ReportFigure(key=key, step="07_bench", label="decode_tok_s", value=value, unit="tok/s",
                         spread={"min": lo, "max": hi, "n": n}, higher_is_better=True)


def _model(run_id, figures):
    step = StepInfo(name="07_bench", title="Benchmark", ran=True, has_sidecar=True)
    return ReportModel(run_id=run_id, run_path="/x/" + run_id, generated="", manifest={}, profile={},
                              provenance={}, steps=[step], figures=figures)


def test_bench_figures_move_only_beyond_their_spread():
    prev = _model("a", [_bench_figure("07_bench/c1/decode_tok_s", 100.0, 90.0, 110.0),
                        _bench_figure("07_bench/c2/decode_tok_s", 100.0, 98.0, 102.0)])
    cur = _model("b", [_bench_figure("07_bench/c1/decode_tok_s", 75.0, 60.0, 91.0),      # -25 % but ranges overlap
                       _bench_figure("07_bench/c2/decode_tok_s", 95.0, 94.0, 96.0)])     # -5 % but apart
    d = drift.compare(cur, prev, rel_tol=0.2)
    assert [(i.key, i.direction) for i in d.items] == [("07_bench/c2/decode_tok_s", "worse")]
    assert "do not overlap" in d.items[0].detail


def test_steps_not_in_both_runs_are_not_compared(tmp_path):
    root = tmp_path / "results"
    build_run(root, "20261201-030000-lab", created="2026-12-01T03:00:00+00:00", steps=("00_preflight", "01_network"))
    cur = build_run(root, "20261201-040000-lab", created="2026-12-01T04:00:00+00:00",
                    steps=("00_preflight", "02_weights"), tcp=(1.0, 1.0))
    d = collect(cur, results_root=root, redactor=RED).drift
    assert d.not_compared == ["01_network", "02_weights"]
    assert d.items == []


def test_no_previous_good_run(tmp_path):
    root = tmp_path / "results"
    cur = build_run(root, "20261201-040000-lab")
    model = collect(cur, results_root=root, redactor=RED)
    assert model.drift.previous_run_id is None and "no previous good run" in model.drift.reason
    assert "no previous good run" in render_html(model, redactor=RED)
    json.dumps(model.to_dict(), default=str)      # serialisable (index / debugging)
