"""The serving watchdog on the lab's real TP=2 vLLM: a frozen worker rank (SIGSTOP) and a fabric link set
down, each during a long streamed request, are caught within 30 s with the right explanation; after
SIGCONT / link up the tokens flow again."""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from runbook.facts import ranks
from runbook.launch import stop
from runbook.api import endpoint
from runbook.api.watchdog import Watchdog
from runbook.remote import Cluster

pytestmark = [pytest.mark.lab, pytest.mark.vllm, pytest.mark.slow]
PROFILE = "env/lab.env"
IF = "enp1s0f0np0"
CAUGHT_WITHIN_S = 30


@pytest.fixture
def running(lab_server):
    """The lab profile's shared server (tests/lab/conftest.py ``lab_server``: reused when it runs, started
    otherwise; a frozen rank or a downed link is recovered by the test that made it)."""
    with Cluster.from_profile(lab_server) as cluster:
        yield lab_server, cluster


def _long_stream(profile, seconds: float = 120.0) -> threading.Thread:
    """A streamed completion long enough to be in flight while the fault is injected (its outcome is not
    the point: the watchdog's view of it is)."""
    def go():
        body = {"model": profile.served_model_name, "prompt": "Once upon a time", "max_tokens": 3500,
                "stream": True, "ignore_eos": True}
        try:
            with httpx.stream("POST", f"{endpoint.base_url(profile)}/v1/completions", json=body, timeout=seconds) as r:
                for _ in r.iter_bytes():
                    pass
        except httpx.HTTPError:
            pass
    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


def _generated(profile) -> float:
    from runbook.facts.prom import MetricsSnapshot
    text = httpx.get(f"{endpoint.base_url(profile)}/metrics", timeout=5).text
    return MetricsSnapshot.from_text(0, text).total("vllm:generation_tokens_total") or 0.0


def _wait_for_tokens(profile, timeout: float = 60.0) -> None:
    start = _generated(profile)
    deadline = time.monotonic() + timeout
    while _generated(profile) <= start:
        assert time.monotonic() < deadline, "tokens did not flow"
        time.sleep(0.5)


def _first_alert(dog: Watchdog, timeout: float):
    deadline = time.monotonic() + timeout
    while not dog.alerts and time.monotonic() < deadline:
        time.sleep(0.5)
    return dog.alerts[0] if dog.alerts else None


def _worker_pgid(cluster, profile) -> int:
    state = ranks.rank_state(cluster.worker, profile)
    assert state.running and state.pid, state.describe()
    return state.pid


def test_frozen_worker_rank_is_caught_and_recovers(running):
    profile, cluster = running
    _long_stream(profile)
    _wait_for_tokens(profile)
    dog = Watchdog(profile, echo=print).start()
    pgid = _worker_pgid(cluster, profile)
    t0 = time.monotonic()
    cluster.worker.run(f"kill -STOP -- -{pgid}", timeout=10)
    try:
        alert = _first_alert(dog, CAUGHT_WITHIN_S + 15)
        caught = time.monotonic() - t0
    finally:
        cluster.worker.run(f"kill -CONT -- -{pgid}", timeout=10)
    dog.stop()
    print(f"\n[watchdog] frozen worker caught after {caught:.1f} s: {alert and alert.observed}")
    assert alert is not None and alert.kind == "wedge", dog.alerts
    assert caught <= CAUGHT_WITHIN_S, caught
    # the fabric is fine and both ranks "run": the explanation must not blame the link, and it names the
    # frozen rank (its processes in state T) rather than "every rank running"
    assert alert.rows and not any(r.failed for r in alert.rows if r.name.startswith("fabric")), alert.rows
    frozen = [r for r in alert.rows if r.name == "rank not frozen"]
    assert frozen and frozen[0].node == "worker" and frozen[0].failed, alert.rows
    assert "rank not frozen@worker" in alert.explanation()
    # its "N s" counts from the stall's start (the last scrape that saw tokens, just before the SIGSTOP)
    assert dog.stall_s <= alert.after_s <= caught + 2 * dog.interval_s + 1, (alert.after_s, caught)
    _wait_for_tokens(profile, timeout=60)       # SIGCONT: generation moves again


def test_fabric_link_down_is_caught_with_the_link_named_and_recovers(running):
    profile, cluster = running
    _long_stream(profile)
    _wait_for_tokens(profile)
    dog = Watchdog(profile, echo=print).start()
    t0 = time.monotonic()
    cluster.worker.run(f"ip link set {IF} down", timeout=10)
    try:
        alert = _first_alert(dog, CAUGHT_WITHIN_S + 15)
        caught = time.monotonic() - t0
    finally:
        cluster.worker.run(f"ip link set {IF} up", timeout=10)
    dog.stop()
    print(f"\n[watchdog] link down caught after {caught:.1f} s: {alert and alert.explanation()}")
    assert alert is not None and alert.kind == "wedge", dog.alerts
    assert caught <= CAUGHT_WITHIN_S, caught
    down = [r for r in alert.rows if r.name == "fabric link up" and r.node == "worker"]
    assert down and down[0].failed and IF in down[0].observed, alert.rows
    _wait_for_tokens(profile, timeout=120)      # link up: TCP retransmits and the collective continues


def test_a_timed_out_stream_ends_quietly(running):
    """A bench request that times out mid-stream records the timeout and prints no CancelledError traceback
    (issue 25: exception() was called on the cancelled future inside connection_lost)."""
    import asyncio

    from runbook.benchmark.client import RequestRecord, make_stream_client, stream_request
    from runbook.secrets import load_secrets
    profile, _ = running
    errors: list[dict] = []

    async def go() -> RequestRecord:
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
        http = make_stream_client(endpoint.base_url(profile), load_secrets().api_key or None)
        rec = RequestRecord(id="timeout-probe")
        body = {"model": profile.served_model_name, "prompt": "Once upon a time", "max_tokens": 3500,
                "stream": True, "ignore_eos": True}
        rec = await stream_request(http, "completions", body, rec, timeout_s=2.0)
        await asyncio.sleep(0.5)                    # connection_lost of the aborted connection runs here
        await http.close()
        return rec

    rec = asyncio.run(go())
    assert rec.error.startswith("timeout after 2 s"), rec.error
    assert errors == [], [repr(e) for e in errors]


def test_head_api_killed_mid_request_is_caught_and_the_orphans_are_named(running):
    """Last in this module (it ends the server). The head's API server is killed (SIGKILL on its main process
    only, as the OOM killer would) while a request streams: the watchdog fires "api-gone" within 30 s, and the
    rows say which ranks are left running, with the command that stops them; stop then leaves nothing."""
    profile, cluster = running
    _long_stream(profile)
    _wait_for_tokens(profile)
    head = ranks.rank_state(cluster.head, profile)
    assert head.running and head.pid, head.describe()
    dog = Watchdog(profile, echo=print).start()
    t0 = time.monotonic()
    cluster.head.run(f"kill -KILL {head.pid}", timeout=10)
    alert = _first_alert(dog, CAUGHT_WITHIN_S + 15)
    caught = time.monotonic() - t0
    dog.stop()
    print(f"\n[watchdog] head API killed, caught after {caught:.1f} s: {alert and alert.observed} -- "
          f"{alert and alert.explanation()}")
    assert alert is not None and alert.kind == "api-gone", dog.alerts
    assert caught <= CAUGHT_WITHIN_S, caught
    rank_rows = {r.node: r for r in alert.rows if r.name == "rank running"}
    assert sorted(rank_rows) == ["head", "worker"] and rank_rows["head"].failed, alert.rows
    if not rank_rows["worker"].failed:          # the worker's rank outlived the head: named, with the stop command
        orphans = [r for r in alert.rows if r.name == "no orphaned ranks"]
        assert orphans and "worker" in orphans[0].node and "runbook stop" in orphans[0].fix, alert.rows
    stopped = stop.stop(cluster, profile, mem_settle_s=0)
    assert stopped.ok, stopped.checks.to_text()
