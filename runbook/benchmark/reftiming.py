"""The reference server's timing truth: one timer writing every stream's chunks at absolute deadlines, the
emission log it stamps, and that log as the client's ``RequestRecord``s.

All times are ``time.perf_counter`` (CLOCK_MONOTONIC, shared system-wide with the client). Chunk ``j`` of a
stream is written at ``t_first + j * step`` (no drift); the truth stamp of a write is taken just before the
bytes are handed to the kernel.
"""
from __future__ import annotations

import asyncio
import dataclasses
import heapq
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EmitLog", "Emitter", "WriteScheduler", "clock", "truth_records"]

clock = time.perf_counter


@dataclass
class EmitLog:
    """One generation request as the server saw and wrote it (``RefServer.log``, ``GET /ref/log``)."""
    id: int
    endpoint: str
    prompt_tokens: int
    max_tokens: int
    t_arrival: float
    nonce: str = ""                      # first word of the prompt / the system message
    conn: int = 0                        # which TCP connection carried it (1, 2, ... in accept order)
    temperature: float | None = None     # as requested
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    text_head: str = ""                  # the first 80 characters of the last message / the prompt
    t_slot: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0
    tokens: int = 0
    chunk_t: list[float] = field(default_factory=list)
    chunk_cum: list[int] = field(default_factory=list)
    status: str = "running"



@dataclass
class Emitter:
    """One stream on the scheduler: its first deadline, the time between writes, and ``make(j)`` giving the
    bytes of write j and whether it is the last."""
    t_first: float
    step: float
    make: Any
    entry: EmitLog
    transport: Any
    fut: asyncio.Future
    keep_log: bool
    j: int = 0


class WriteScheduler:
    """One timer for all streams: a heap of absolute chunk deadlines (no per-chunk coroutine), so the server
    is cheap per token and does not become the bottleneck."""

    def __init__(self) -> None:
        self._heap: list = []
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def schedule(self, em: Emitter) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (em.t_first, self._seq, em))
        if self._timer is None or em.t_first < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._arm()

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer_at = self._heap[0][0]
        self._timer = loop.call_at(self._timer_at + (loop.time() - clock()), self._tick)

    def _tick(self) -> None:
        self._timer = None
        heap = self._heap
        now = clock()
        while heap and heap[0][0] <= now + 0.0002:
            _, seq, em = heapq.heappop(heap)
            if em.transport.is_closing():
                em.entry.status = "disconnected"
                if not em.fut.done():
                    em.fut.set_result(None)
                continue
            data, last = em.make(em.j)
            t = clock()                 # truth stamp: just before the bytes are handed to the kernel
            em.transport.write(data)
            e = em.entry
            if em.j == 0:
                e.t_first = t
            e.t_last = t
            if em.keep_log:
                e.chunk_t.append(t)
                e.chunk_cum.append(e.tokens)
            em.j += 1
            if last:
                if not em.fut.done():
                    em.fut.set_result(None)
            else:
                heapq.heappush(heap, (em.t_first + em.j * em.step, seq, em))
            now = clock()
        if heap:
            self._arm()


def truth_records(log: list[EmitLog] | list[dict[str, Any]]):
    """Server-side truth as ``RequestRecord``s (same clock as the client): t_sent = arrival of the
    request line, token times = write times. Feed them to :mod:`runbook.benchmark.metrics` to get the
    figures the server actually produced; ``nonce`` links them to the client's records."""
    from .client import RequestRecord
    out = []
    for e in log:
        d = e if isinstance(e, dict) else dataclasses.asdict(e)
        if not d["chunk_t"]:
            continue
        out.append(RequestRecord(
            id=f"server/{d['id']}", nonce=d["nonce"], t_sent=d["t_arrival"], t_first_chunk=d["t_first"],
            t_first_token=d["t_first"], t_last_token=d["t_last"], t_end=d["t_last"],
            first_chunk_tokens=d["chunk_cum"][0], prompt_tokens=d["prompt_tokens"],
            completion_tokens=d["tokens"], continuous_usage=True, n_token_events=len(d["chunk_t"]),
            ev_t=list(d["chunk_t"]), ev_cum=list(d["chunk_cum"]), max_tokens=d["max_tokens"],
            error="" if d["status"] == "ok" else d["status"]))
    return out
