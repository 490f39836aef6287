"""The long phases report through the one progress channel (issue 38 item 2, ``runbook.progress``): each producer's
counts rise and end at their total. The downloader's test is in test_weights.py (the in-process Hub), the packer's
in test_engram_resume.py (the real packer under bash); here the readiness wait and the bench."""
from __future__ import annotations

import pytest
from support.counts import assert_rising_to_the_end, seeing
from support.memnodes import readiness_ready_at_poll
from support.profiles import profile_from
from test_launch_render import _plan

from runbook import progress
from runbook.benchmark.refserver import RefConfig, serve_in_thread
from runbook.benchmark.result import BenchConfig
from runbook.benchmark.runner import case_requests, run_benchmark


@pytest.fixture
def seen():
    with seeing() as sink:
        yield sink


def test_the_readiness_wait_counts_ranks_up_and_seconds_of_ready_timeout(monkeypatch, seen):
    prof = profile_from("env/lab.env", MEM_FLOOR_GIB=4)
    result = readiness_ready_at_poll(monkeypatch, prof, _plan("lab"), [9, 8, 8, 8], 4)
    assert result.readiness.done
    up = seen.of("ranks up")
    assert_rising_to_the_end(up)
    assert up[-1][1:3] == (2, 2)                                  # both ranks up of two
    waited = seen.of("ready wait")
    assert_rising_to_the_end(waited, at_total=False)
    assert waited[-1][2] == prof.ready_timeout and 0 < waited[-1][1] < prof.ready_timeout
    assert progress.finals()["ranks up"]["ended"] and progress.finals()["ready wait"]["unit"] == "s"


def test_the_bench_counts_its_requests_done_of_all_cases(seen):
    cfg = BenchConfig(prompt_tokens=40, decode_tokens=8, concurrency=(1, 2), prefill_tokens=(50,), repeats=2,
                      warmup_requests=1)
    with serve_in_thread(RefConfig(ttft_s=0.005, interval_s=0.002)) as srv:
        res = run_benchmark(srv.base_url, "ref-model", cfg)
    assert res.status == "PASS"
    counted = seen.of("bench requests")
    assert_rising_to_the_end(counted)
    total = case_requests(cfg)
    assert total == 2 * (1 + 2 + 1) == sum(c.concurrency * c.repeats for c in res.cases)
    assert counted[-1][1:3] == (total, total)
