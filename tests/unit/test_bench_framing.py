"""The bench client against the reference server in every wire framing, checked against its truth.

Servers and proxies frame the same SSE stream differently: headers and the first events in one TCP
segment (nginx, LiteLLM), the last event and the terminating chunk together, events cut at any
byte offset across HTTP chunks (and a chunk completed only by the next write), keep-alive or
``Connection: close``, chunked, Content-Length or read-to-close bodies. A reader that parses a byte
only when later bytes arrive reports TTFT one inter-chunk interval late or loses the last event.

Truth is the reference server's emission log (same CLOCK_MONOTONIC): TTFT truth = the write time of
the first token-bearing write - the client's send stamp. Asserted per framing: median TTFT error over
its requests <= 1 ms + 2 x the p95 scheduler delay measured during the run (tests/support/loadprobe.py); each case's median error < half an interval (a reader one write late is
off by a whole interval on every request; one scheduler stall on the shared 2-core box delays one request); output tokens
exact; every stream complete (no "stream ended without [DONE]"); connections reused or not as framed.
"""
from __future__ import annotations

import json
import statistics
import urllib.error
import urllib.request

import pytest

from runbook.benchmark import metrics as M
from runbook.benchmark.refserver import RefConfig, spawn
from runbook.benchmark.result import BenchConfig, load_records
from runbook.benchmark.runner import run_benchmark
from support.loadprobe import LoadProbe

# timing against a spawned reference server: make test, not make check, and on the lab's worker (timed)
pytestmark = [pytest.mark.slow, pytest.mark.timed]

TTFT, INTERVAL = 0.08, 0.05
PROMPT, DECODE, PREFILL_P = 40, 10, 300

#: name -> (RefConfig changes, endpoint)
FRAMINGS = {
    "separate-writes": ({}, "chat"),
    "head+first-events": ({"coalesce_head": True}, "chat"),
    "last-event+terminator": ({"coalesce_tail": True}, "chat"),
    "head+first, last+terminator": ({"coalesce_head": True, "coalesce_tail": True}, "completions"),
    "fragmented chunks": ({"fragment_seed": 7}, "chat"),
    "fragmented+coalesced, 3 tok/chunk": ({"fragment_seed": 11, "coalesce_head": True, "coalesce_tail": True,
                                           "tokens_per_chunk": 3}, "chat"),
    "chunked, Connection: close": ({"connection_close": True, "coalesce_head": True, "coalesce_tail": True},
                                   "chat"),
    "Content-Length, keep-alive": ({"body": "length", "coalesce_head": True, "coalesce_tail": True}, "chat"),
    "Content-Length, close": ({"body": "length", "connection_close": True, "coalesce_head": True},
                              "completions"),
    "read-to-close": ({"body": "close", "coalesce_head": True, "coalesce_tail": True}, "chat"),
}
BASE = {"tokens_per_chunk": 1, "body": "chunked", "coalesce_head": False, "coalesce_tail": False,
        "fragment_seed": 0, "connection_close": False}


def _post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=10).read() or b"{}")


def _log(url: str) -> list[dict]:
    return json.loads(urllib.request.urlopen(url + "/ref/log", timeout=10).read())


@pytest.fixture(scope="module")
def server():
    with spawn(RefConfig(ttft_s=TTFT, interval_s=INTERVAL, prefill_tok_s=20_000.0)) as url:
        yield url


def run_framing(url: str, out, changes: dict, endpoint: str):
    """One short bench run in a framing; returns (result, client records, truth by nonce)."""
    _post(url, "/ref/config", {**BASE, **changes})
    _post(url, "/ref/clear", {})
    cfg = BenchConfig(endpoint=endpoint, prompt_tokens=PROMPT, decode_tokens=DECODE, concurrency=(1, 2),
                      prefill_tokens=(PREFILL_P,), repeats=2, warmup_requests=2, warmup_decode_tokens=4)
    res = run_benchmark(url, "ref-model", cfg, out)
    t0 = res.environment["t0_perf_counter"]
    truth = {e["nonce"]: e for e in _log(url)}
    return res, load_records(out), truth, t0


@pytest.mark.parametrize("name", list(FRAMINGS))
def test_ttft_and_tokens_exact_in_every_framing(server, tmp_path, name):
    changes, endpoint = FRAMINGS[name]
    with LoadProbe() as probe:
        res, recs, truth, t0 = run_framing(server, tmp_path, changes, endpoint)
    load = probe.load
    assert recs, "no requests recorded"
    errors = [r.error for r in recs if r.error]
    assert not errors, f"{name}: {errors[:3]}"
    report, all_errs, all_truths = {}, [], []
    case_errs: dict[str, list[float]] = {}
    assert res.cases, f"{name}: no case measured"
    for case in res.cases:
        assert case.status != "FAIL", (name, case.name, case.failures)
        rs = [r for r in recs if r.case == case.name]
        assert rs, case.name
        errs = []
        for r in rs:
            e = truth[r.nonce]
            assert e["status"] == "ok", (name, e)
            assert r.completion_tokens == e["tokens"] == r.max_tokens, (name, r.id, r.completion_tokens, e["tokens"])
            true_ttft = (e["t_first"] - t0) - r.t_sent
            errs.append(M.ttft_s(r) - true_ttft)
            all_truths.append(true_ttft)
        all_errs += errs
        case_errs[case.name] = errs
        report[case.name] = (f"median |err| {statistics.median(map(abs, errs)) * 1e3:.2f} ms, "
                             f"max {max(map(abs, errs)) * 1e3:.2f} ms")
    print(f"\n{name}: {report}; {load}")
    med_err = statistics.median(abs(x) for x in all_errs)
    # The load model (tests/support/loadprobe.py): the client's TTFT error is its reader's error plus how late the
    # scheduler wakes it, so the bound is a reader's budget (1 ms: 0.2-0.5 ms seen idle) plus twice the p95
    # wake-up delay measured during this very run (client and server are both woken per event). A reader one
    # write late is off by a whole interval (50 ms); once the bound reaches a quarter of that, the run cannot tell
    # a late reader from a loaded machine, and says so instead of passing.
    tol = 0.001 + 2 * load.p95_s
    assert tol < INTERVAL / 4, (name, f"too loaded to judge: {load}; the bound {tol * 1e3:.1f} ms would pass a "
                                      "reader late by a quarter interval", report)
    assert med_err <= tol, (name, f"median |TTFT error| {med_err * 1e3:.2f} ms > {tol * 1e3:.2f} ms "
                                  f"(1 ms + 2 x p95 delay; {load})", report)
    # a late reader is late on every request: in each case even the closest request is off by less than half an
    # interval. Not the case's median: scheduler stalls on a loaded 2-core box delayed 2 of a case's 4 requests by
    # 68 and 85 ms in one `make test` (median 34.7 ms), a reader that was right on the other two.
    assert case_errs and all(min(abs(x) for x in errs) < INTERVAL / 2
                             for errs in case_errs.values()), (name, report)
    # connection reuse is what the framing says: keep-alive reuses, close never does
    gen = [e for e in truth.values() if e["nonce"]]
    conns = {e["conn"] for e in gen}
    closing = changes.get("connection_close") or changes.get("body") == "close"
    if closing:
        assert len(conns) == len(gen), f"{name}: a closed connection was reused"
    else:
        assert len(conns) < len(gen), f"{name}: keep-alive connections were not reused"


def test_refserver_refuses_unknown_framing(server):
    with pytest.raises(ValueError, match="body='nope'.*chunked, length, close"):
        RefConfig(body="nope")
    with pytest.raises(ValueError, match="fragment_seed .* needs body='chunked'"):
        RefConfig(body="length", fragment_seed=3)
    req = urllib.request.Request(server + "/ref/config", data=json.dumps({"body": "nope"}).encode(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=10)
    assert ei.value.code == 400 and b"RefConfig.body" in ei.value.read()


def _wire(body_mode: str, events: list[bytes]) -> tuple[bytes, list[tuple[int, int]]]:
    """A response in ``body_mode`` and, per body byte, its wire position: [(wire_end, body_len_so_far)]."""
    body = b"".join(events)
    if body_mode == "length":
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
        return head + body, [(len(head) + i + 1, i + 1) for i in range(len(body))]
    if body_mode == "eof":
        head = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
        return head + body, [(len(head) + i + 1, i + 1) for i in range(len(body))]
    wire = bytearray(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    marks, done = [], 0
    for k, ev in enumerate(events):                # chunk sizes unrelated to event boundaries
        for piece in (ev[:len(ev) // 3], ev[len(ev) // 3:]) if k % 2 else (ev,):
            wire += b"%x;ext=1\r\n" % len(piece)
            for byte in piece:
                wire.append(byte)
                done += 1
                marks.append((len(wire), done))
            wire += b"\r\n"
    wire += b"0\r\nX-Trailer: 1\r\n\r\n"
    return bytes(wire), marks


@pytest.mark.parametrize("body_mode", ["chunked", "length", "eof"])
def test_every_byte_is_handed_on_in_the_read_that_brings_it(body_mode):
    """Feed the parser at every split of the wire (1-byte reads, and two-read splits at each offset):
    after each read, exactly the body bytes wholly contained in the bytes read so far were delivered,
    the head was announced before any body byte, and the response ends exactly at its last byte."""
    import asyncio
    import random

    from runbook.benchmark.http import HttpProtocol

    events = [b'data: {"choices":[{"text":"tok %d"}]}\n\n' % i for i in range(5)] + [b"data: [DONE]\n\n"]
    wire, marks = _wire(body_mode, events)
    body = b"".join(events)
    rng = random.Random(5)
    splits = [list(range(1, len(wire)))] + [[c] for c in range(1, len(wire))] + \
             [sorted(rng.sample(range(1, len(wire)), 7)) for _ in range(50)]
    assert splits

    async def feed(cuts: list[int]) -> None:
        p = HttpProtocol()
        got: list[bytes] = []
        order: list[str] = []
        p.start(lambda b, t: (got.append(b), order.append("body")), lambda s, h, t: order.append(f"head {s}"))
        bounds = [0, *cuts, len(wire)]
        for a, b in zip(bounds[:-1], bounds[1:]):
            p.data_received(wire[a:b])
            want = max([n for end, n in marks if end <= b], default=0)
            assert b"".join(got) == body[:want], (body_mode, cuts, b)
        if body_mode == "eof":
            assert not p.done_fut.done()
            p.connection_lost(None)
        assert p.done_fut.done() and p.done_fut.result() is True
        assert order[0] == "head 200" and order.count("head 200") == 1
        assert b"".join(got) == body

    async def main() -> None:
        for cuts in splits:
            await feed(cuts)

    asyncio.run(main())
