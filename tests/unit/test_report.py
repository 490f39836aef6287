"""The run report: matrix from the sidecars, figures recomputed from raw files, secrets masked,
self-contained HTML, sections of steps that did not run, results index, CLI.

Synthetic run folders are written in the real formats (shapes copied from archived lab runs: 00/01/02/03
sidecars, iperf3 ``-J`` client JSON, ping text, ib_write_bw text, Engram tool JSON, the launch plan's
``rendered.json``, and a real benchmark output produced against the reference server).
"""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from runbook.report import page as report
from runbook.secrets import Redactor

HF = "hf_" + "Q" * 30
API = "sk-live-planted-api-key-0123456789"


# ------------------------------------------------------------------------------------------------
# builders (real file formats)
# ------------------------------------------------------------------------------------------------

def chk(name, node="head", status="PASS", observed="", expected="", evidence=(), data=None, fix=""):
    return {"name": name, "node": node, "status": status, "observed": observed, "expected": expected, "fix": fix,
            "evidence": list(evidence), "data": dict(data or {})}


def iperf_json(recv_bps: float, sent_bps: float) -> str:
    return json.dumps({"start": {"connected": [{"socket": 5, "local_host": "10.0.0.1", "local_port": 40407,
                                                "remote_host": "10.0.0.2", "remote_port": 5302}],
                                 "version": "iperf 3.12", "test_start": {"protocol": "TCP", "num_streams": 1,
                                                                         "reverse": 0}},
                       "intervals": [],
                       "end": {"sum_sent": {"start": 0, "end": 3.0, "seconds": 3.0, "bytes": 1, "bits_per_second": sent_bps,
                                            "retransmits": 0, "sender": True},
                               "sum_received": {"start": 0, "end": 3.0, "seconds": 3.0, "bytes": 1,
                                                "bits_per_second": recv_bps, "sender": True}}}, indent=1)


def ping_text(avg: float) -> str:
    return ("PING 10.0.0.2 (10.0.0.2) from 10.0.0.1 enp1s0f0np0: 8972(9000) bytes of data.\n"
            "8980 bytes from 10.0.0.2: icmp_seq=1 ttl=64 time=0.151 ms\n\n"
            "--- 10.0.0.2 ping statistics ---\n5 packets transmitted, 5 received, 0% packet loss, time 815ms\n"
            f"rtt min/avg/max/mdev = 0.064/{avg}/0.151/0.031 ms\n")


def ib_bw_text(avg: float) -> str:
    return ("---------------------------------------------------------------------------------------\n"
            "                    RDMA_Write BW Test\n Dual-port       : OFF\t\tDevice         : rocep1s0f0\n"
            " Mtu             : 4096[B]\n Link type       : Ethernet\n GID index       : 3\n"
            "---------------------------------------------------------------------------------------\n"
            " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
            f" 65536      5000             {avg + 0.05:.2f}              {avg:.2f}  \t\t   0.176563\n"
            "---------------------------------------------------------------------------------------\n")


PROFILE = {"PROFILE_NAME": "lab", "RECIPE": "lab", "HEAD_SSH": "spark-head", "WORKER_SSH": "spark-worker",
           "HEAD_IP": "10.0.0.1", "WORKER_IP": "10.0.0.2", "MIN_TCP_GBPS": 0.1, "MAX_RTT_MS": 5.0,
           "MAX_CLOCK_OFFSET_MS": 50.0, "READY_TIMEOUT": 900, "SERVED_MODEL_NAME": "tiny", "SSH_KEY": ".lab/id_ed25519"}


def write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def build_run(root: Path, run_id: str, *, status: str = "passed", created: str = "2026-12-01T04:00:00+00:00",
              profile: str = "lab", tcp=(9.133, 7.765), kernel: str = "6.18.44", gpu_status: str = "N/A",
              steps=("00_preflight", "01_network", "02_weights", "03_engram", "04_launch"), bench: Path | None = None,
              plant: dict | None = None, command_flag: str = "--max-model-len 4096") -> Path:
    run = root / run_id
    (run / "steps").mkdir(parents=True)
    man = {"version": 1, "run_id": run_id, "profile": profile, "created": created, "status": status, "steps": {},
           "mode": "headless", "dry_run": False, "profile_source": "env/lab.env"}
    prof = dict(PROFILE, PROFILE_NAME=profile)
    if plant:
        prof.update(plant.get("profile", {}))
    write(run / "profile.json", json.dumps(prof, indent=2))
    write(run / "provenance.json", json.dumps({"git": {"sha": "a" * 40, "dirty": False}, "python": "3.11.2",
                                               "packages": {"papermill": "2.6"}, "host": {"hostname": "x"}}))

    def sidecar(step, checks, data, st="passed"):
        write(run / "steps" / f"{step}.json", json.dumps({"step": step, "status": st, "written": created,
                                                         "checks": checks, "data": data}, indent=2))
        counts = {s: sum(1 for c in checks if c["status"] == s) for s in ("PASS", "FAIL", "WARN", "N/A", "NO-OP")}
        man["steps"][step] = {"notebook": f"notebooks/{step}.ipynb", "status": st, "seconds": 12.5, "exit": 0,
                              "error": "", "checks": counts, "check_status": st, "sidecar": f"steps/{step}.json"}

    if "00_preflight" in steps:
        nodes = {n: {"os": "Debian GNU/Linux 12 (bookworm)", "kernel": kernel, "machine": "x86_64", "hostname": f"spark-{n}",
                     "mem_available": 24135057408 + i, "docker": "20.10.24", "gpus": [], "driver": None,
                     "image_id": "sha256:" + "e" * 64, "image_layers": [], "listening": [22]}
                 for i, n in enumerate(("head", "worker"))}
        checks = [chk("ssh reachable", "head", observed="hostname spark-head", expected="key-only SSH"),
                  chk("kernel parity", "cluster", observed=f"head={kernel}, worker={kernel}", expected="identical"),
                  chk("GPU present", "head", gpu_status, observed="profile expects no GPU", expected="none (EXPECT_GPU=0)"),
                  chk("memory available", "head", observed="MemAvailable 22.5 GiB", expected=">= 3.0 GiB",
                      data={"mem_available_bytes": nodes["head"]["mem_available"], "need_gib": 3.0}),
                  chk("clock offset between nodes", "cluster", observed="5.7 ms", expected="<= 50 ms",
                      data={"spread_ms": (0.013017416 - 0.007323503) * 1000, "uncertainty_ms": 30.4})]
        if plant:
            checks.append(chk("planted", "head", "WARN", observed=plant["observed"], expected="nothing secret",
                              fix=plant.get("fix", "")))
        sidecar("00_preflight", checks, {"nodes": nodes, "clock_offsets_s": {"head": [0.007323503, 0.0298],
                                                                              "worker": [0.013017416, 0.0303]},
                                         "duration_s": 5.7})
    if "01_network" in steps:
        checks, bw = [], []
        for (a, b), gbps in zip((("head", "worker"), ("worker", "head")), tcp):
            base = f"iperf3_rail0_{a}_to_{b}"
            write(run / "raw/01_network" / f"{base}_client.json", iperf_json(gbps * 1e9, gbps * 1e9 * 1.002))
            write(run / "raw/01_network" / f"{base}_server.json", "{}")
            write(run / "raw/01_network" / f"ping_rail0_{a}_to_{b}.txt", ping_text(0.088))
            checks.append(chk(f"net.ping.rail0.{a}->{b}", a, observed="0% loss", expected="0% loss",
                              evidence=[f"raw/01_network/ping_rail0_{a}_to_{b}.txt"],
                              data={"rtt_avg_ms": 0.088, "rtt_max_ms": 0.151}))
            data = {"kind": "tcp", "rail": "rail0", "direction": f"{a}->{b}", "gbps": gbps * 1e9 / 1e9,
                    "threshold_gbps": 0.1, "sender_gbps": gbps * 1.002}
            checks.append(chk(f"net.tcp.rail0.{a}->{b}", a, observed=f"{gbps:.2f} Gb/s received",
                              expected=">= 0.1 Gb/s (MIN_TCP_GBPS)",
                              evidence=[f"raw/01_network/{base}_client.json", f"raw/01_network/{base}_server.json"],
                              data=data))
            bw.append({**{k: data[k] for k in ("kind", "rail", "direction", "gbps", "threshold_gbps")}, "status": "PASS"})
        write(run / "raw/01_network/ib_write_bw_rail0_head_to_worker_client.txt", ib_bw_text(92.57))
        checks.append(chk("net.rdma.bw.rail0.head->worker", "head", observed="92.57 Gb/s", expected=">= 90 Gb/s",
                          evidence=["raw/01_network/ib_write_bw_rail0_head_to_worker_client.txt"],
                          data={"kind": "rdma", "rail": "rail0", "direction": "head->worker", "gbps": 92.57,
                                "threshold_gbps": 90.0, "gid_index": 3, "mtu": 4096}))
        checks.append(chk("net.rdma.bw.total.head->worker", "cluster", observed="92.57 Gb/s", expected=">= 90",
                          data={"kind": "rdma_total", "direction": "head->worker", "gbps": 92.57, "threshold_gbps": 90.0}))
        checks.append(chk("net.gid", "head", observed="index 3", expected="RoCE v2", data={"resolved": 3}))
        checks.append(chk("net.gid", "worker", observed="index 3", expected="RoCE v2", data={"resolved": 3}))
        sidecar("01_network", checks, {"bandwidth": bw, "duration_s": 13.0})
    if "02_weights" in steps:
        checks = [chk("weights.verified", n, observed="7/7 files ok", expected="7/7 files",
                      data={"bytes_hashed": 9048126, "files_hashed": 7, "seconds": s, "gbps": round(9048126 / s / 1e9, 4),
                            "revision": "708253b", "failed": []})
                  for n, s in (("head", 0.2701), ("worker", 0.3923))]
        sidecar("02_weights", checks, {"repo": "spark-runbook/tiny", "revision": "708253b", "files": 7,
                                       "total_bytes": 9048126, "mode": "rsync"})
    if "03_engram" in steps:
        from runbook.engram.step import record, probe_checks
        results = {}
        for n, ops in (("head", 12529), ("worker", 12554)):
            results[n] = {
                "pack": {"ok": True, "exit": 0, "tool": "engram-pack", "files": [], "bytes_written": 104857600,
                         "seconds": 2.5, "mb_s": round(104857600 / 2.5 / 1e6, 1), "peak_rss_bytes": 15 << 20, "wall_s": 2.7},
                "check": {"ok": True, "tool": "engram-check", "files": [{"path": "/x/engram-l1-r0of2.bin", "ok": True,
                                                                          "rows_checked": 257, "problems": []}]},
                "probe": {"ok": True, "tool": "engram-probe", "mode": "direct", "file": "/x/engram-l1-r0of2.bin",
                          "results": [{"qd": 1, "ops": ops, "seconds": 3.001, "iops": round(ops / 3.0007, 1),
                                       "lat_us": {"p50": 63.1, "p99": 3555.4}, "errors": []}]}}

        class _Step:   # the library's record() writes the sidecar data + raw JSON exactly as the step does
            data: dict = {}

            def raw(self, name, text):
                write(run / "raw/03_engram" / name, text)
                return f"raw/03_engram/{name}"
        st = _Step()
        st.data = {}
        record(st, results)
        checks = [c.to_record() for n in results for c in probe_checks(n, results[n]["probe"])]
        sidecar("03_engram", checks, st.data)
    if "04_launch" in steps:
        ranks = [{"node": n, "rank": r, "headless": r == 1, "runtime": "process", "env": {"VLLM_HOST_IP": ip},
                  "secret_env": ["VLLM_API_KEY"], "serve_argv": ["vllm", "serve"],
                  "display": f"env VLLM_HOST_IP={ip} VLLM_API_KEY=*** vllm serve /m {command_flag} --tensor-parallel-size 2"
                             + (" --headless" if r else "")}
                 for n, r, ip in (("head", 0, "10.0.0.1"), ("worker", 1, "10.0.0.2"))]
        write(run / "raw/04_launch/rendered.json", json.dumps({"profile": profile, "recipe": "lab", "runtime": "process",
                                                               "fingerprint": "f" * 64, "ranks": ranks}))
        ready = {"port_open": 20.5, "health": 21.0, "models": 21.2, "first_token": 23.75}
        checks = [chk(f"ready: {ph.replace('_', ' ')}", "head", observed=f"{s:.1f} s from launch",
                      expected="within READY_TIMEOUT=900 s", data={"seconds": s}) for ph, s in ready.items()]
        sidecar("04_launch", checks, {"launch": {"base_url": "http://10.0.0.1:8000", "fingerprint": "f" * 64,
                                                 "runtime": "process", "reused": False, "readiness_s": ready,
                                                 "head_started_s": 1.2, "startup_log": {}, "capacity": []}})
    if bench is not None:
        import shutil
        from runbook.bench.result import BenchResult
        dest = run / "raw/07_bench"
        shutil.copytree(bench, dest)
        res = BenchResult.load(dest / "result.json")
        sidecar("07_bench", [c.to_record() for c in res.checks()], {"result": "raw/07_bench/result.json"})
    write(run / "manifest.json", json.dumps(man, indent=2))
    return run


@pytest.fixture(scope="session")
def bench_out(tmp_path_factory):
    """A real benchmark output (result.json + requests/chunks/metrics JSONL) against the reference server."""
    from runbook.bench.refserver import RefConfig, serve_in_thread
    from runbook.bench.result import BenchConfig
    from runbook.bench.runner import run_benchmark
    out = tmp_path_factory.mktemp("bench")
    with serve_in_thread(RefConfig(ttft_s=0.02, interval_s=0.004, prefill_tok_s=20000.0)) as srv:
        cfg = BenchConfig(prompt_tokens=64, decode_tokens=24, concurrency=(1, 2), prefill_tokens=(256,), repeats=2,
                          warmup_requests=1, recipe="exl3-v41")
        run_benchmark(srv.base_url, "ref-model", cfg, out)
    return out


RED = Redactor([API])


@pytest.fixture
def results(tmp_path):
    return tmp_path / "results"


# ------------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------------

def test_matrix_rows_equal_the_sidecars_checks(results):
    run = build_run(results, "20261201-040000-lab")
    model = report.collect(run, redactor=RED)
    for sc_path in sorted((run / "steps").glob("*.json")):
        sc = json.loads(sc_path.read_text())
        rows = [(c.name, c.node, c.status, c.observed, c.expected) for c in model.checks if c.step == sc["step"]]
        assert rows == [(c["name"], c["node"], c["status"], c["observed"], c["expected"]) for c in sc["checks"]]
    html = report.render_html(model, redactor=RED)
    for c in model.checks:            # every check appears in the page
        assert f"<td>{c.name.replace('>', '&gt;')}</td>" in html


def _iperf_gbps(path: Path) -> float:
    return json.loads(path.read_text())["end"]["sum_received"]["bits_per_second"] / 1e9


def test_network_weights_engram_figures_equal_independent_recomputation(results):
    run = build_run(results, "20261201-040000-lab")
    model = report.collect(run, redactor=RED)
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
    assert all(c.status != "FAIL" for c in report.report_checks(model))


def test_bench_figures_recomputed_from_jsonl(results, bench_out):
    run = build_run(results, "20261201-040000-lab", bench=bench_out)
    model = report.collect(run, redactor=RED)
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
    html = report.render_html(model, redactor=RED)
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
    model = report.collect(run, redactor=RED)
    assert [f.key for f in model.inconsistent()] == ["01_network/net.tcp.rail0.head->worker"]
    rec = {c.name: c for c in report.report_checks(model)}
    assert rec["figures recomputed"].status.value == "FAIL"
    assert "19.5" in rec["figures recomputed"].observed


def test_no_secret_survives_into_the_html(results):
    plant = {"observed": f"HF_TOKEN={HF} curl -H 'Authorization: Bearer {API}' --api-key {API}",
             "fix": f"export VLLM_API_KEY={API}", "profile": {"EXTRA_SECRET_TOKEN": "plain-value-9876", "NOTE": HF}}
    run = build_run(results, "20261201-040000-lab", plant=plant)
    path, _ = report.write_report(run, redactor=RED)
    page = path.read_text()
    for secret in (HF, API, "plain-value-9876"):
        assert secret not in page
    assert "***" in page
    index = (results / "index.html").read_text() + (results / "index.json").read_text()
    assert HF not in index and API not in index


def test_html_is_self_contained(results, bench_out):
    run = build_run(results, "20261201-040000-lab", bench=bench_out)
    path, model = report.write_report(run, redactor=RED)
    page = path.read_text()
    assert report.external_refs(page) == []
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.I)
    assert "<script" not in page and "<link" not in page
    srcs = re.findall(r'<img[^>]*src="([^"]+)"', page)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not list(run.glob(".report.html.*"))      # atomic write left no partial


def test_steps_that_did_not_run_say_so_and_nothing_fails(results):
    run = build_run(results, "20261201-040000-lab", steps=("00_preflight",))
    path, model = report.write_report(run, redactor=RED)
    page = path.read_text()
    for step in ("01_network", "02_weights", "03_engram", "04_launch", "07_bench"):
        assert f"Step {step} did not run in this run." in page
    assert model.notes == []
    checks = {c.name: c.status.value for c in report.report_checks(model, path)}
    assert checks == {"report written": "PASS", "figures recomputed": "PASS", "drift": "N/A"}


def test_an_unreadable_section_becomes_a_note_not_an_exception(results):
    run = build_run(results, "20261201-040000-lab")
    (run / "raw/04_launch/rendered.json").write_text('{"ranks": [{"node": "head", "rank": "x", "env": 5}]}')
    model = report.collect(run, redactor=RED)
    assert any(n.startswith("launch:") for n in model.notes)
    assert "launch: section could not be built" in report.render_html(model, redactor=RED)


def test_index_lists_runs_with_headline_figures(results):
    build_run(results, "20261201-040000-lab", created="2026-12-01T04:00:00+00:00")
    build_run(results, "20261201-050000-lab", created="2026-12-01T05:00:00+00:00", status="failed", tcp=(5.0, 4.0))
    html_path, json_path = report.write_index(results, redactor=RED)
    idx = json.loads(json_path.read_text())
    assert [r["run_id"] for r in idx["runs"]] == ["20261201-050000-lab", "20261201-040000-lab"]
    assert idx["runs"][0]["status"] == "failed" and idx["runs"][0]["headline"]["tcp_gbps_min"] == pytest.approx(4.0)
    assert idx["runs"][1]["headline"]["ready_first_token_s"] == 23.75
    assert "20261201-040000-lab" in html_path.read_text()


def test_cli_report_writes_report_and_index(results, capsys):
    from runbook.cli import main
    build_run(results, "20261201-040000-lab")
    rc = main(["report", "20261201-040000-lab", "--results", str(results)])
    assert rc == 0
    assert (results / "20261201-040000-lab/report.html").exists()
    assert (results / "index.html").exists() and (results / "index.json").exists()
    assert "report:" in capsys.readouterr().out
    assert main(["report", "no-such-run", "--results", str(results)]) != 0


def test_close_respects_the_recorded_rounding():
    assert report.close(0.03349917, 0.0335)
    assert not report.close(0.0336, 0.0335)
    assert report.close(9.133164295698709, 9.133164295698709)
    assert not report.close(9.13317, 9.133164295698709)


def test_figure_tolerates_rounding_of_both_the_input_and_the_recorded_value():
    # CI case: gbps recorded (4 decimals) from unrounded seconds; recomputed from seconds rounded to 4 decimals.
    nbytes, true_seconds = 100_000_000, 1.000501
    recorded = round(nbytes / true_seconds / 1e9, 4)
    seconds = round(true_seconds, 4)
    fig = report.Figure(key="w/verify_gbps/head", step="w", label="x", value=nbytes / seconds / 1e9,
                        recorded=recorded, rel_tol=report.rounding_rel_tol(seconds))
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
    model = report.collect(run, redactor=RED)
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
    model = report.collect(run, redactor=RED)
    assert not [f for f in model.figures if "/verify_gbps/" in f.key or "/verified_bytes/" in f.key]
    assert not [f.key for f in model.inconsistent() if f.key.startswith("02_weights")]


def test_bench_time_figure_tolerates_stamps_stored_to_a_tenth_of_a_microsecond():
    # CI case: release skew 51.321 us from raw clocks, 51.4 us from stamps stored as round(t - t0, 7)
    a, b = 10.223361549, 10.223412951
    recorded = b - a
    value = round(b, 7) - round(a, 7)
    fig = report.Figure(key="07_bench/c/release_skew_s", step="07_bench", label="release_skew_s", value=value,
                        recorded=recorded, rel_tol=report.BENCH_REL_TOL, abs_tol=report.BENCH_TIME_ABS_TOL)
    assert fig.consistent
    fig.value = recorded + 1e-6                   # a microsecond off is a real disagreement
    assert fig.consistent is False
