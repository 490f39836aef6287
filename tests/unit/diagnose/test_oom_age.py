"""An OOM kill in the host's kernel ring buffer counts only when it happened after the rank's start (or,
with no rank running, within the last hour): the lab's nodes share one kernel and its whole history."""
from __future__ import annotations

import datetime as dt
import json

from runbook.diagnose import BY_ID, Bundle
from runbook.diagnose import bundle as B


def _line(at: dt.datetime) -> str:
    return (f"[{at.strftime('%a %b %e %H:%M:%S %Y')}] Memory cgroup out of memory: Killed process 4242 (python) "
            "total-vm:114916kB, anon-rss:97900kB, file-rss:6732kB, shmem-rss:0kB, UID:0 pgtables:260kB oom_score_adj:0")


def _hits(dmesg: str, *, started: float | None = None, collected: float | None = None):
    texts = {B.DMESG: dmesg}
    if started is not None:
        texts[B.START_RECORD] = json.dumps({"started_at": started})
    timings = {"collected_at": collected} if collected is not None else {}
    return BY_ID["oom-killed"].signature(Bundle({"head": texts}, timings=timings))


def test_a_kill_before_the_rank_started_is_history():
    now = dt.datetime.now().replace(microsecond=0)
    old = _line(now - dt.timedelta(hours=2))
    assert _hits(old, started=now.timestamp()) == []
    assert _hits(old, collected=now.timestamp()) == []          # no rank: older than an hour
    assert _hits(old)                                           # no time to judge by: reported


def test_a_kill_after_the_rank_started_is_reported():
    now = dt.datetime.now().replace(microsecond=0)
    hits = _hits(_line(now), started=(now - dt.timedelta(minutes=5)).timestamp())
    assert hits and "4242" in hits[0].evidence[0]
