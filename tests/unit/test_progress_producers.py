"""The long phases report through the one progress channel (issue 38 item 2, ``runbook.progress``): each producer's
counts rise and end at their total. The downloader's test is in test_weights.py (the in-process Hub), the packer's
in test_engram_resume.py (the real packer under bash); here the readiness wait and the bench."""
from __future__ import annotations

import threading
import time

import pytest
from test_launch_render import _plan
from test_memguard import GIB, _start_nodes, profile

from runbook import progress
from runbook.benchmark.refserver import RefConfig, serve_in_thread
from runbook.benchmark.result import BenchConfig
from runbook.benchmark.runner import case_requests, run_benchmark
from runbook.launch import memguard, server


class Seen:
    """A sink keeping what the channel showed: (label, done, total, final)."""

    def __init__(self):
        self.shown = []
        self._lock = threading.Lock()

    def show(self, counter, text, final):
        with self._lock:
            self.shown.append((counter.label, counter.done, counter.total, final))

    def of(self, label):
        return [s for s in self.shown if s[0] == label]


@pytest.fixture
def seen():
    sink = Seen()
    progress.use(sink)
    progress.reset()
    yield sink
    progress.use(None)
    progress.reset()


def rising_to_the_end(shown):
    assert shown, "nothing was counted"
    done = [s[1] for s in shown]
    assert done == sorted(done), done
    assert shown[-1][3], shown[-1]                     # it ended


def test_the_readiness_wait_counts_ranks_up_and_seconds_of_ready_timeout(monkeypatch, seen):
    prof = profile(MEM_FLOOR_GIB=4)
    plan = _plan("lab")
    polls = []

    def ready_on_fourth_poll(profile, url, api_key, ready, t0):
        polls.append(1)
        if len(polls) >= 4:
            for ph in server.PHASES:
                setattr(ready, ph, 1.0)
            ready.models_detail = "tiny"
    monkeypatch.setattr(server, "stop", lambda *a, **k: pytest.fail("nothing to stop"))
    monkeypatch.setattr(server, "probe_readiness", ready_on_fourth_poll)
    monkeypatch.setattr(server, "POLL_S", 0.3)
    monkeypatch.setattr(memguard, "MEM_POLL_S", 0.05)
    cluster = _start_nodes([9, 8, 8, 8], [])
    result = server.StartResult(plan=plan, base_url="http://x", mem_before={"head": 9 * GIB, "worker": 9 * GIB})
    server._readiness(cluster, prof, plan, result, "http://x", "", lambda n, t: n, True, cleanup=True,
                      t0=time.monotonic(), started=True)
    assert result.readiness.done
    up = seen.of("ranks up")
    rising_to_the_end(up)
    assert up[-1][1:3] == (2, 2)                                  # both ranks up of two
    waited = seen.of("ready wait")
    rising_to_the_end(waited)
    assert waited[-1][2] == prof.ready_timeout and 0 < waited[-1][1] < prof.ready_timeout
    assert progress.finals()["ranks up"]["ended"] and progress.finals()["ready wait"]["unit"] == "s"


def test_the_bench_counts_its_requests_done_of_all_cases(seen):
    cfg = BenchConfig(prompt_tokens=40, decode_tokens=8, concurrency=(1, 2), prefill_tokens=(50,), repeats=2,
                      warmup_requests=1)
    with serve_in_thread(RefConfig(ttft_s=0.005, interval_s=0.002)) as srv:
        res = run_benchmark(srv.base_url, "ref-model", cfg)
    assert res.status == "PASS"
    counted = seen.of("bench requests")
    rising_to_the_end(counted)
    total = case_requests(cfg)
    assert total == 2 * (1 + 2 + 1) == sum(c.concurrency * c.repeats for c in res.cases)
    assert counted[-1][1:3] == (total, total)
