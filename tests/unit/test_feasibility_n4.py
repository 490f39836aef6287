"""runbook.lab.feasibility_n4: the parts that decide a result without running vLLM (the measurement itself is run by
hand: docs/four-nodes.md)."""
from __future__ import annotations

from pathlib import Path

import pytest

from runbook.lab import feasibility_n4 as f4
from runbook.lab import switchlab

DATA = Path(__file__).parent / "data"


def test_ray_status_node_count_from_a_real_four_node_cluster():
    text = (DATA / "ray_status_4nodes.txt").read_text()     # `ray status` on the fn4 switch, Ray 2.60.0
    assert f4.ray_node_count(text) == 4
    pending_only = text.replace(" 1 node_", " 0 node_", 3)
    assert f4.ray_node_count(pending_only) == 1
    assert f4.ray_node_count("") == 0


def test_a_node_listed_under_pending_is_not_counted():
    text = ("Node status\n-----\nActive:\n 1 node_aa\nPending:\n 10.78.0.14: node_bb, setting up\n"
            "Recent failures:\n (no failures)\n")
    assert f4.ray_node_count(text) == 1


@pytest.mark.parametrize("cpus, ranks, want", [({0, 1}, 4, ["0", "1", "1", "1"]),
                                               ({0, 1, 2}, 4, ["0", "1", "2", "1"]),
                                               ({3}, 2, ["3", "3"])])
def test_omp_binds_head_alone_on_the_first_cpu(monkeypatch, cpus, ranks, want):
    monkeypatch.setattr(f4.os, "sched_getaffinity", lambda _pid: cpus)
    assert f4.omp_binds(ranks) == want


def test_unknown_config_is_refused_before_anything(capsys):
    assert f4.main(["--configs", "tp4,tp8", "--prefix", "fnx", "--venv", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert "unknown config(s) ['tp8']" in err and "/nonexistent/bin/python" in err
    assert switchlab.existing_nodes(switchlab.Switch("fnx", "10.78.0")) == []


def test_rank_lines_and_error_lines(tmp_path):
    log = tmp_path / "r.log"
    log.write_text("(Worker pid=1) INFO [parallel_state.py:1906] world_size=4 rank=2 local_rank=0 "
                   "distributed_init_method=tcp://10.78.0.11:29501 backend=gloo\n"
                   "ValueError: current platform cpu does not support ray.\n")
    assert f4.rank_lines(log) == ["world_size=4 rank=2 local_rank=0 distributed_init_method=tcp://10.78.0.11:29501 "
                                  "backend=gloo"]
    assert f4.error_lines(log) == ["ValueError: current platform cpu does not support ray."]
