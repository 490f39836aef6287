"""The run report: matrix from the sidecars, figures recomputed from raw files, secrets masked,
self-contained HTML, sections of steps that did not run, results index, CLI.

Run folders come from ``tests/support/runs.py`` (real file formats, a real bench output).
"""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from runbook.cli import main
from runbook.report import collector, html_page, index, model as report_model, recompute_bench, write
from runbook.report.checks import report_checks
from runbook.report.html_parts import external_refs
from runbook.secrets import Redactor
from support.runs import API, HF, bench_output, build_run, chk, edit_sidecar


@pytest.fixture(scope="session")
def bench_out(tmp_path_factory):
    return bench_output(tmp_path_factory.mktemp("bench"))


RED = Redactor([API])


@pytest.fixture
def results(tmp_path):
    return tmp_path / "results"


# ------------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------------

def test_matrix_rows_equal_the_sidecars_checks(results):
    run = build_run(results, "20261201-040000-lab")
    model = collector.collect(run, redactor=RED)
    sidecars = sorted((run / "steps").glob("*.json"))
    assert sidecars and model.checks
    for sc_path in sidecars:
        sc = json.loads(sc_path.read_text())
        rows = [(c.name, c.node, c.status, c.observed, c.expected) for c in model.checks if c.step == sc["step"]]
        assert rows == [(c["name"], c["node"], c["status"], c["observed"], c["expected"]) for c in sc["checks"]]
    html = html_page.render_html(model, redactor=RED)
    for c in model.checks:            # every check appears in the page
        assert f"<td>{c.name.replace('>', '&gt;')}</td>" in html


def _iperf_gbps(path: Path) -> float:
    return json.loads(path.read_text())["end"]["sum_received"]["bits_per_second"] / 1e9


def test_network_weights_engram_figures_equal_independent_recomputation(results):
    run = build_run(results, "20261201-040000-lab")
    model = collector.collect(run, redactor=RED)
    raw = run / "raw/01_network"
    for a, b in (("head", "worker"), ("worker", "head")):
        f = model.figure(f"01_network/net.tcp.rail0.{a}->{b}")
        assert f.value == pytest.approx(_iperf_gbps(raw / f"iperf3_rail0_{a}_to_{b}_client.json"), rel=1e-12)
        ping = re.search(r"= [\d.]+/([\d.]+)/", (raw / f"ping_rail0_{a}_to_{b}.txt").read_text())
        assert model.figure(f"01_network/net.ping.rail0.{a}->{b}").value == float(ping.group(1))
    line = [l for l in (raw / "ib_write_bw_rail0_head_to_worker_client.txt").read_text().splitlines()
            if l.strip().startswith("65536")][0]
    assert model.figure("01_network/net.rdma.bw.rail0.head->worker").value == float(line.split()[3])
    assert model.figure("01_network/net.rdma.bw.total.head->worker").value == float(line.split()[3])
    sc = json.loads((run / "steps/02_weights.json").read_text())
    assert sc["checks"], "02_weights recorded no check"
    for c in sc["checks"]:
        d = c["data"]
        assert model.figure(f"02_weights/verify_gbps/{c['node']}").value == pytest.approx(
            d["bytes_hashed"] / d["seconds"] / 1e9)
    for node in ("head", "worker"):
        probe = json.loads((run / f"raw/03_engram/probe-{node}.json").read_text())
        r = probe["results"][0]
        assert model.figure(f"03_engram/probe_qd1_iops/{node}").value == pytest.approx(r["ops"] / r["seconds"])
        pack = json.loads((run / f"raw/03_engram/pack-{node}.json").read_text())
        assert model.figure(f"03_engram/pack_mb_s/{node}").value == pytest.approx(
            pack["bytes_written"] / pack["seconds"] / 1e6)
    offs = json.loads((run / "steps/00_preflight.json").read_text())["data"]["clock_offsets_s"]
    assert model.figure("00_preflight/clock_offset_ms").value == pytest.approx(
        (offs["worker"][0] - offs["head"][0]) * 1000)
    assert model.figure("04_launch/ready/first_token").value == 23.75
    # and every figure agrees with what its step recorded
    assert model.inconsistent() == []
    own = report_checks(model)
    assert own and all(c.status != "FAIL" for c in own), [(c.name, c.status) for c in own]


def test_bench_figures_recomputed_from_jsonl(results, bench_out):
    run = build_run(results, "20261201-040000-lab", bench=bench_out)
    model = collector.collect(run, redactor=RED)
    rows = [json.loads(l) for l in (run / "raw/07_bench/requests.jsonl").read_text().splitlines()]
    chunks = [json.loads(l) for l in (run / "raw/07_bench/chunks.jsonl").read_text().splitlines()]
    first_cum = {}
    for c in chunks:                      # tokens carried by the first token-bearing event of each request
        r = next(x for x in rows if x["id"] == c["id"])
        if c["cum_tokens"] and c["id"] not in first_cum and c["t"] >= r["t_first_token"] - 1e-9:
            first_cum[c["id"]] = c["cum_tokens"]
    result = json.loads((run / "raw/07_bench/result.json").read_text())
    decode_cases = [c["name"] for c in result["cases"] if c["kind"] == "decode"]
    assert decode_cases
    for case in decode_cases:
        ok = [r for r in rows if r["case"] == case and not r["error"]]
        ttft = statistics.median(r["t_first_token"] - r["t_sent"] for r in ok)
        dec = statistics.median((r["completion_tokens"] - (r["first_chunk_tokens"] or 1))
                                / (r["t_last_token"] - r["t_first_token"]) for r in ok)
        assert model.figure(f"07_bench/{case}/ttft_s").value == pytest.approx(ttft, rel=1e-9)
        assert model.figure(f"07_bench/{case}/decode_tok_s").value == pytest.approx(dec, rel=1e-9)
        span = []
        for t in sorted({r["trial"] for r in ok}):
            tr = [r for r in ok if r["trial"] == t]
            toks = sum(r["completion_tokens"] - (r["first_chunk_tokens"] or 1) for r in tr)
            span.append(toks / (max(r["t_last_token"] for r in tr) - min(r["t_first_token"] for r in tr)))
        assert model.figure(f"07_bench/{case}/aggregate_span_tok_s").value == pytest.approx(statistics.median(span))
    pre = [c["name"] for c in result["cases"] if c["kind"] == "prefill"][0]
    ok = [r for r in rows if r["case"] == pre]
    per_trial = [r["prompt_tokens"] / (r["t_first_token"] - r["t_sent"]) for r in ok if r["stream"] == 0]
    assert model.figure(f"07_bench/{pre}/prefill_tok_s").value == pytest.approx(statistics.median(per_trial))
    assert model.inconsistent() == [], [(f.key, f.value, f.recorded) for f in model.inconsistent()]
    html = html_page.render_html(model, redactor=RED)
    assert "exl3-v41" in html and "MiaAI-Lab" in html           # beside the recipe's published figures
    assert html.count("data:image/png;base64,") >= 3            # network, readiness, bench plots embedded


def test_a_recorded_figure_the_raw_file_does_not_support_is_flagged(results):
    run = build_run(results, "20261201-040000-lab")
    sc_path = run / "steps/01_network.json"
    sc = json.loads(sc_path.read_text())
    for c in sc["checks"]:
        if c["name"] == "net.tcp.rail0.head->worker":
            c["data"]["gbps"] = 19.5
    sc_path.write_text(json.dumps(sc))
    model = collector.collect(run, redactor=RED)
    assert [f.key for f in model.inconsistent()] == ["01_network/net.tcp.rail0.head->worker"]
    rec = {c.name: c for c in report_checks(model)}
    assert rec["figures recomputed"].status.value == "FAIL"
    assert "19.5" in rec["figures recomputed"].observed


def test_no_secret_survives_into_the_html(results):
    plant = {"observed": f"HF_TOKEN={HF} curl -H 'Authorization: Bearer {API}' --api-key {API}",
             "fix": f"export VLLM_API_KEY={API}", "profile": {"EXTRA_SECRET_TOKEN": "plain-value-9876", "NOTE": HF}}
    run = build_run(results, "20261201-040000-lab", plant=plant)
    path, _ = write.write_report(run, redactor=RED)
    page = path.read_text()
    for secret in (HF, API, "plain-value-9876"):
        assert secret not in page
    assert "***" in page
    index = (results / "index.html").read_text() + (results / "index.json").read_text()
    assert HF not in index and API not in index


def test_html_is_self_contained(results, bench_out):
    run = build_run(results, "20261201-040000-lab", bench=bench_out)
    path, model = write.write_report(run, redactor=RED)
    page = path.read_text()
    assert external_refs(page) == []
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.I)
    assert "<script" not in page and "<link" not in page
    srcs = re.findall(r'<img[^>]*src="([^"]+)"', page)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not list(run.glob(".report.html.*"))      # atomic write left no partial


def test_steps_that_did_not_run_say_so_and_nothing_fails(results):
    run = build_run(results, "20261201-040000-lab", steps=("00_preflight",))
    path, model = write.write_report(run, redactor=RED)
    page = path.read_text()
    for step in ("01_network", "02_weights", "03_engram", "04_launch", "07_bench"):
        assert f"Step {step} did not run in this run." in page
    assert model.notes == []
    checks = {c.name: c.status.value for c in report_checks(model, path)}
    assert checks == {"report written": "PASS", "figures recomputed": "PASS", "drift": "N/A", "run verdict": "N/A"}


def test_an_unreadable_section_becomes_a_note_not_an_exception(results):
    run = build_run(results, "20261201-040000-lab")
    (run / "raw/04_launch/rendered.json").write_text('{"ranks": [{"node": "head", "rank": "x", "env": 5}]}')
    model = collector.collect(run, redactor=RED)
    assert any(n.startswith("launch:") for n in model.notes)
    assert "launch: section could not be built" in html_page.render_html(model, redactor=RED)


def test_index_lists_runs_with_headline_figures(results):
    build_run(results, "20261201-040000-lab", created="2026-12-01T04:00:00+00:00")
    build_run(results, "20261201-050000-lab", created="2026-12-01T05:00:00+00:00", status="failed", tcp=(5.0, 4.0))
    html_path, json_path = index.write_index(results, redactor=RED)
    idx = json.loads(json_path.read_text())
    assert [r["run_id"] for r in idx["runs"]] == ["20261201-050000-lab", "20261201-040000-lab"]
    assert idx["runs"][0]["status"] == "failed" and idx["runs"][0]["headline"]["tcp_gbps_min"] == pytest.approx(4.0)
    assert idx["runs"][1]["headline"]["ready_first_token_s"] == 23.75
    assert "20261201-040000-lab" in html_path.read_text()


def test_cli_report_writes_report_and_index(results, capsys):
    build_run(results, "20261201-040000-lab")
    rc = main(["report", "20261201-040000-lab", "--results", str(results)])
    assert rc == 0
    assert (results / "20261201-040000-lab/report.html").exists()
    assert (results / "index.html").exists() and (results / "index.json").exists()
    assert "report:" in capsys.readouterr().out
    assert main(["report", "no-such-run", "--results", str(results)]) != 0


def test_close_respects_the_recorded_rounding():
    assert report_model.close(0.03349917, 0.0335)
    assert not report_model.close(0.0336, 0.0335)
    assert report_model.close(9.133164295698709, 9.133164295698709)
    assert not report_model.close(9.13317, 9.133164295698709)


def test_figure_tolerates_rounding_of_both_the_input_and_the_recorded_value():
    # CI case: gbps recorded (4 decimals) from unrounded seconds; recomputed from seconds rounded to 4 decimals.
    nbytes, true_seconds = 100_000_000, 1.000501
    recorded = round(nbytes / true_seconds / 1e9, 4)
    seconds = round(true_seconds, 4)
    fig = report_model.ReportFigure(key="w/verify_gbps/head", step="w", label="x", value=nbytes / seconds / 1e9,
                        recorded=recorded, rel_tol=report_model.rounding_rel_tol(seconds))
    assert fig.consistent
    # a real disagreement (1 %) is still caught
    fig.value *= 1.01
    assert fig.consistent is False


def test_share_rate_has_one_figure_per_receiving_node(results):
    # TP=3: the head shares to two workers; each copy is its own figure (one key would hide one of them)
    run = build_run(results, "20261201-040000-lab")
    path = run / "steps/02_weights.json"
    sc = json.loads(path.read_text())
    sc["checks"] += [chk("weights.rsync", "worker", data={"bytes": 9048126, "seconds": 0.5}),
                     chk("weights.rsync", "worker2", data={"bytes": 9048126, "seconds": 2.0})]
    path.write_text(json.dumps(sc))
    model = collector.collect(run, redactor=RED)
    assert model.figure("02_weights/share_gbps/worker").value == pytest.approx(9048126 / 0.5 / 1e9)
    assert model.figure("02_weights/share_gbps/worker2").value == pytest.approx(9048126 / 2.0 / 1e9)


def test_manifest_reuse_run_has_no_verification_rate(results):
    # a re-run that reused the manifest hashed 0 bytes in a few microseconds: nothing to recompute
    run = build_run(results, "20261201-040000-lab")
    path = run / "steps/02_weights.json"
    sc = json.loads(path.read_text())
    for c in sc["checks"]:
        c["data"].update(bytes_hashed=0, files_hashed=0, seconds=0.000412, gbps=0.0)
    path.write_text(json.dumps(sc))
    model = collector.collect(run, redactor=RED)
    assert model.figures, "no figure at all: the next two lines would hold for nothing"
    assert not [f for f in model.figures if "/verify_gbps/" in f.key or "/verified_bytes/" in f.key]
    assert not [f.key for f in model.inconsistent() if f.key.startswith("02_weights")]


def test_bench_time_figure_tolerates_stamps_stored_to_a_tenth_of_a_microsecond():
    # CI case: release skew 51.321 us from raw clocks, 51.4 us from stamps stored as round(t - t0, 7)
    a, b = 10.223361549, 10.223412951
    recorded = b - a
    value = round(b, 7) - round(a, 7)
    fig = report_model.ReportFigure(key="07_bench/c/release_skew_s", step="07_bench", label="release_skew_s", value=value,
                        recorded=recorded, rel_tol=recompute_bench.BENCH_REL_TOL, abs_tol=recompute_bench.BENCH_TIME_ABS_TOL)
    assert fig.consistent
    fig.value = recorded + 1e-6                   # a microsecond off is a real disagreement
    assert fig.consistent is False


def test_raw_files_are_read_where_the_sidecars_say(results, bench_out):
    # no guessed run paths: the bench result and the Engram tool JSON are found through the sidecars
    run = build_run(results, "20261201-040000-lab", bench=bench_out)
    (run / "raw/07_bench").rename(run / "raw/bench-moved")
    (run / "raw/03_engram").rename(run / "raw/engram-moved")
    edit_sidecar(run, "07_bench", lambda sc: sc.update(data={"bench": {"result": "raw/bench-moved/result.json"}}))
    edit_sidecar(run, "03_engram", lambda sc: sc["data"].update(
        engram_raw={k: v.replace("raw/03_engram/", "raw/engram-moved/") for k, v in sc["data"]["engram_raw"].items()}))
    model = collector.collect(run, redactor=RED)
    bench_figs = model.figures_of("bench")
    assert bench_figs and {f.source for f in bench_figs if f.recorded is not None} == {
        "raw/bench-moved/requests.jsonl + chunks.jsonl"}
    assert model.figure("03_engram/probe_qd1_iops/head").source == "raw/engram-moved/probe-head.json"
    assert model.engram["raw_files"] and all(p.startswith("raw/engram-moved/") for p in model.engram["raw_files"])
    assert model.inconsistent() == []
    # a 07 sidecar that names no result: no bench section (nothing is searched for)
    edit_sidecar(run, "07_bench", lambda sc: sc.update(data={}))
    assert collector.collect(run, redactor=RED).bench == {}


def test_startup_memory_profile_is_plotted_with_each_nodes_lowest_point(tmp_path):
    run = build_run(tmp_path / "results", "20261202-050000-lab")
    sidecar = run / "steps" / "04_launch.json"
    doc = json.loads(sidecar.read_text())
    gib = 2 ** 30
    doc["data"]["launch"]["memory_profile"] = {"head": [[0.0, 20 * gib], [8.0, 14 * gib], [16.0, 17 * gib]],
                                               "worker": [[0.0, 21 * gib], [8.0, 19 * gib]]}
    sidecar.write_text(json.dumps(doc))
    model = collector.collect(run, drift=False, redactor=RED)
    lows = {f.node: f for f in model.figures if f.group == "memory"}
    assert sorted(lows) == ["head", "worker"]
    assert lows["head"].value == 14 and "8 s from launch" in lows["head"].label
    assert lows["worker"].value == 19
    html = html_page.render_html(model, redactor=RED)
    assert "Startup memory" in html and "minimum MemAvailable through the start" in html


def test_the_minimum_memavailable_per_rank_is_recomputed_from_the_samples_against_the_floor(tmp_path):
    """Issue 25: the report shows every rank's minimum MemAvailable through the start (and the highest memory PSI)
    recomputed from the guard's stored samples, beside what the start recorded and the floor; an edited record
    shows as a disagreement; an aborted start says which rank crossed which limit."""
    run = build_run(tmp_path / "results", "20261203-050000-lab")
    sidecar = run / "steps" / "04_launch.json"
    doc = json.loads(sidecar.read_text())
    gib = 2 ** 30
    launch = doc["data"]["launch"]
    launch["memory_profile"] = {"head": [[0.0, 20 * gib], [1.5, 15 * gib], [3.0, 16 * gib]],
                                "worker": [[0.0, 21 * gib], [1.5, 3.5 * gib]]}
    launch["memory_psi"] = {"head": [[0.0, 0.0, 0.0], [1.5, 4.2, 1.25], [3.0, 0.5, 0.0]]}
    launch["memory_guard"] = {"period_s": 1.5, "floor_gib": 4.0, "psi_full_max": 25.0,
                              "breach": {"node": "worker", "what": "floor", "t": 1.5},
                              "minimum": {"head": {"min_mem_available": 15 * gib, "max_psi_full": 1.25},
                                          "worker": {"min_mem_available": int(3.5 * gib), "max_psi_full": None}}}
    sidecar.write_text(json.dumps(doc))
    model = collector.collect(run, drift=False, redactor=RED)
    mins = {f.node: f for f in model.figures if f.key.endswith("/min_available")}
    assert sorted(mins) == ["head", "worker"]
    assert (mins["head"].value, mins["head"].recorded, mins["head"].threshold) == (15, 15, 4.0)
    assert mins["worker"].value == 3.5 and mins["worker"].consistent
    psi = [f for f in model.figures if f.key.endswith("/max_psi_full")]
    assert [(f.node, f.value, f.recorded, f.threshold) for f in psi] == [("head", 1.25, 1.25, 25.0)]
    html = html_page.render_html(model, redactor=RED)
    assert "minimum MemAvailable through the start" in html and "the start was aborted" in html
    assert "highest memory PSI full avg10" in html
    launch["memory_guard"]["minimum"]["head"]["min_mem_available"] = 18 * gib      # a record that was edited
    sidecar.write_text(json.dumps(doc))
    model = collector.collect(run, drift=False, redactor=RED)
    assert [f.node for f in model.inconsistent() if f.key.endswith("/min_available")] == ["head"]


def test_a_rehearsal_lists_its_substitutions_by_class_with_counts(results):
    """The classes with their counts, the lab class by goal group (one count: lab.rehearsal.count), every key with
    its class and goal group, and the run's mode (not a substitution)."""
    from runbook.lab import rehearsal
    from runbook.lab.rehearsal import substitutions
    from runbook.profile import load_profile
    profile, _, subs = rehearsal.load_rehearsal("env/dspark-v4.env")
    classes = {kind: [s for s in subs if s.kind == kind] for kind in ("hardware", "lab")}
    assert classes["hardware"] and classes["lab"]
    run = build_run(results, "20261201-040000-dspark-v4")
    (run / "rehearsal.json").write_text(json.dumps(rehearsal.record(profile, [s.to_dict() for s in subs])))
    model = collector.collect(run, redactor=RED)
    html = html_page.render_html(model, redactor=RED)
    goals = rehearsal.count([s.to_dict() for s in subs])["lab_by_goal"]
    counts = (f"hardware: {len(classes['hardware'])}, lab: {len(classes['lab'])} ("
              + ", ".join(f"{goal}: {n}" for goal, n in goals.items()) + ")")
    assert f"{len(subs)} key(s) substituted ({counts})" in html
    assert "node addresses: 7, Hub endpoint and model: 1, registry host: 1, recipe repository: 2, none: 0" in counts
    for sub in subs:           # a key substituted in part (IMAGE's registry host) says which part
        assert f"<td>{sub.kind}</td><td>{sub.goal}</td><td>{sub.key}{f' ({sub.part})' if sub.part else ''}</td>" in html
    assert "<td>lab</td><td>registry host</td><td>IMAGE (registry host)</td>" in html
    assert "Mode: LAB=1, REHEARSAL=1: the run&#x27;s mode, set by `run --rehearse`" in html
    assert model.to_dict()["rehearsal"]["classes"] == {"hardware": len(classes["hardware"]),
                                                       "lab": len(classes["lab"])}
    # an older run's rehearsal.json (no goal groups, no mode) still renders, counted by the same function
    old = [{k: v for k, v in s.to_dict().items() if k != "goal"} for s in substitutions(load_profile("env/dspark-v4.env"))]
    (run / "rehearsal.json").write_text(json.dumps({"profile": "env/dspark-v4.env", "substituted": old}))
    html = html_page.render_html(collector.collect(run, redactor=RED), redactor=RED)
    assert f"lab: {len(classes['lab'])} (node addresses: 0, " in html and f"none: {len(classes['lab'])})" in html
    assert "Mode:" not in html


def test_a_run_that_is_not_a_rehearsal_has_no_substitution_section(results):
    model = collector.collect(build_run(results, "20261201-040000-lab"), redactor=RED)
    assert model.rehearsal == {}
    assert 'id="rehearsal"' not in html_page.render_html(model, redactor=RED)


def test_a_rehearsal_lists_its_simulated_and_real_tools(results):
    """rehearsal.json's tools (runbook.lab.rehearsal.tools_record): the report says mpirun runs for real and which
    hardware-only tools are simulators."""
    from runbook.lab import sim
    from runbook.lab.rehearsal import tools_record
    record = tools_record()
    assert "mpirun" in record["real"] and "mpirun" not in record["simulated"]
    assert set(record["simulated"]) == {*sim.TOOLS, "all_reduce_perf"}      # every simulator installed, no other
    run = build_run(results, "20261201-050000-exl3-v41")
    (run / "rehearsal.json").write_text(json.dumps({"profile": "env/exl3-v41.env", "substituted": [], "counts": {},
                                                    "tools": record}))
    html = html_page.render_html(collector.collect(run, redactor=RED), redactor=RED)
    assert (f"Tools: {len(record['simulated'])} simulated (hardware: nvidia-smi, ibdev2netdev, ibv_devinfo, "
            "ib_write_bw, ib_write_lat, all_reduce_perf), the rest real (mpirun, perftest,") in html
    assert "<td>real</td><td>mpirun</td>" in html
