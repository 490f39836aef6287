"""The memory-bandwidth probe (runbook/facts/membw_probe.py) and the bench's per-rank validity (bench/membw.py).

The CPU path runs for real here (the lab's probe); the GPU path ran on an H200 (docs/bench.md) and is
exercised here only for its refusal without CUDA.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.doubles import FakeCluster, FakeNode, res
from support.profiles import profile_from

from runbook.bench import membw
from runbook.checks import Status
from runbook.facts import membw_probe

SCRIPT = Path(membw_probe.__file__)


def run_script(*args: str, python: str = sys.executable) -> tuple[int, dict]:
    proc = subprocess.run([python, "-", *args], input=SCRIPT.read_text(), capture_output=True, text=True,
                          timeout=120, check=False)
    return proc.returncode, membw.parse_probe(proc.stdout)


def test_cpu_probe_through_stdin_reports_gbs_and_says_lab():
    rc, out = run_script("--json", "--device", "cpu", "--bytes", str(32 << 20), "--iters", "3")
    assert rc == 0, out
    assert out["device"] == "cpu" and out["method"] == "memcpy"
    assert "CPU memory bandwidth (lab)" in out["label"]
    assert out["gbs"] > 0.1 and out["results"]["memcpy"]["bytes_per_iter"] == 2 * (32 << 20)
    assert out["results"]["memcpy"]["iters"] == 3


def test_stdlib_python_runs_the_cpu_probe():
    # a node's system python3 (no numpy, no torch): the memcpy path alone
    py = "/usr/bin/python3"
    if not Path(py).exists():
        pytest.skip("no /usr/bin/python3")
    rc, out = run_script("--json", "--device", "cpu", "--bytes", str(16 << 20), "--iters", "2", python=py)
    assert rc == 0 and out["gbs"] > 0


def test_gpu_path_without_cuda_is_one_error_line():
    rc, out = run_script("--json", "--device", "gpu")
    assert rc == 1 and out["error"]
    rc, out = run_script("--json", "--bytes", "-1")
    assert rc == 1 and "--bytes" in out["error"]


def test_parse_probe_takes_the_last_json_line_of_the_probe():
    text = 'noise\n{"tool": "other"}\n{"tool": "membw_probe", "gbs": 231.5}\nWARNING trailing\n'
    assert membw.parse_probe(text)["gbs"] == 231.5
    assert membw.parse_probe("Traceback ...")["error"]


def _profile(expect_gpu: bool = False, runtime: str = "docker"):
    """A real profile: the lab's for the CPU path, recipe B's (EXPECT_GPU=1) for the GPU path."""
    if not expect_gpu:
        return profile_from("env/lab.env")
    return profile_from("env/dspark-v4.env", RUNTIME=runtime, CONTAINER_HEAD="vllm-head", CONTAINER_WORKER="vllm-worker")


def test_probe_command_per_runtime():
    lab = membw.probe_cmd(_profile(), "head")
    assert lab.startswith("timeout 120 python3 - --json --device cpu <<'RUNBOOK_MEMBW_EOF'\n")
    assert lab.rstrip().endswith("RUNBOOK_MEMBW_EOF") and "def gpu_probe" in lab
    spark = membw.probe_cmd(_profile(expect_gpu=True, runtime="docker"), "worker")
    assert spark.startswith("timeout 120 docker exec -i vllm-worker python3 - --json --device gpu <<")
    # the process runtime (the lab's) runs the probe with the server's own python when one is given
    proc = membw.probe_cmd(_profile(), "head", python="/opt/venv/bin/python")
    assert proc.startswith("timeout 120 /opt/venv/bin/python - --json --device cpu <<")


def _r(gbs):
    return {"tool": "membw_probe", "gbs": gbs, "label": "GPU memory bandwidth"}


def test_a_rank_below_80_percent_makes_the_bench_invalid():
    # the GB10 slow state: 70 instead of 230 GB/s on one rank
    valid, row = membw.validity({"before": {"head": _r(231.0), "worker": _r(70.0)},
                                 "after": {"head": _r(229.0), "worker": _r(228.0)}}, gpu=True)
    assert valid is False and row.status == Status.FAIL
    assert "worker before the bench at 70.0 GB/s = 30%" in row.observed
    assert "power the slow node off" in row.fix
    # the same on the lab: a WARN (its nodes share one host)
    valid, row = membw.validity({"before": {"head": _r(10.0), "worker": _r(7.0)}}, gpu=False)
    assert valid is False and row.status == Status.WARN


def test_ranks_within_80_percent_are_valid_and_one_rank_is_not_judged():
    valid, row = membw.validity({"before": {"head": _r(230.0), "worker": _r(185.0)},
                                 "after": {"head": _r(226.0), "worker": _r(230.0)}}, gpu=True)
    assert valid is True and row.status == Status.PASS and row.data["worst_ratio"] == pytest.approx(185 / 230)
    valid, row = membw.validity({"before": {"head": _r(230.0), "worker": {"error": "no torch"}}}, gpu=True)
    assert valid is None and row.status == Status.NA


def _node(name: str, rank: int, answer) -> FakeNode:
    """A node whose memory-bandwidth probe answers ``answer`` (stdout, or an exception raised)."""
    return FakeNode(name, rank, rules=[(r"membw_probe|RUNBOOK_MEMBW", answer)], read_only=True)


def test_probe_ranks_runs_one_node_after_another_and_records_rows(tmp_path):
    nodes = [_node("head", 0, json.dumps(_r(11.5))), _node("worker", 1, res(127, "", "python3: not found"))]
    results, rows, raws = membw.probe_ranks(FakeCluster(nodes), _profile(), "before", raw_prefix="raw/07_bench")
    assert results["head"]["gbs"] == 11.5 and results["worker"]["error"]
    assert [r.status for r in rows] == [Status.PASS, Status.WARN]
    assert rows[0].name == "memory bandwidth before bench" and "11.5 GB/s" in rows[0].observed
    assert set(raws) == {"membw_before_head.json", "membw_before_worker.json"}
    assert rows[0].evidence == ["raw/07_bench/membw_before_head.json"]
    assert all(c.timeout == membw.TIMEOUT_S + 30 for n in nodes for c in n.calls) and nodes[1].calls


def test_an_unreachable_node_is_a_warn_row_not_the_end_of_the_bench():
    down = ConnectionError("ssh: connect to host worker port 22: No route to host")
    cluster = FakeCluster([_node("head", 0, json.dumps(_r(230.0))), _node("worker", 1, down)])
    results, rows, raws = membw.probe_ranks(cluster, _profile(expect_gpu=True, runtime="docker"), "after")
    assert rows[1].status == Status.WARN and "No route to host" in rows[1].observed
    assert "No route to host" in raws["membw_after_worker.json"]
    valid, row = membw.validity({"after": results}, gpu=True)
    assert valid is None and row.status == Status.NA
