"""Lab ranks whose memory a test scripts, for the start's memory guard and readiness wait (``runbook.launch``):
the sample text ``MEM_SAMPLE_CMD`` prints, a node answering it, two running ranks, and the readiness wait run over
them until the probe says ready."""
from __future__ import annotations

import re
import time

import pytest

from runbook.facts import ranks, system
from runbook.launch import memguard, server
from support.doubles import FakeCluster, FakeNode

GIB = 1024 ** 3


def psi_line(some: float, full: float) -> str:
    """The PSI file as MEM_SAMPLE_CMD prints it (joined on one line)."""
    return (f"some avg10={some:.2f} avg60=0.00 avg300=0.00 total=12 "
            f"full avg10={full:.2f} avg60=0.00 avg300=0.00 total=7 ")


def sample_text(gib: float, some: float | None = 0.0, full: float | None = 0.0) -> str:
    psi = psi_line(some, full) if some is not None else ""
    return f"{int(gib * GIB) // 1024}\n{psi}\n"


def sampling_node(name, rank, values, *, psi=True):
    """A node whose MemAvailable follows ``values`` (GiB), the last one repeated."""
    seq = list(values)

    def answer(cmd):
        v = seq.pop(0) if len(seq) > 1 else seq[0]
        return sample_text(v, 0.5 if psi else None, 1.5 if psi else None)
    return FakeNode(name, rank, read_only=True, rules=[(re.escape(system.MEM_SAMPLE_CMD) + r"\Z", answer)])


def start_nodes(worker_mem: list[float]) -> FakeCluster:
    """Two lab ranks that keep running (watch: alive, log growing) while the worker's memory falls."""
    def rank_node(name, rank, mems):
        node = sampling_node(name, rank, mems)
        node.rules.append((re.escape(ranks.MEM_LINE), sample_text(9) + "alive\n5\nINFO loading"))
        node.rules.append((r"^tail -n 5000 ", "INFO loading weights"))
        node.rules.append((re.escape(system.LISTEN_CMD) + r"\Z", ""))      # the master port not bound yet
        return node
    return FakeCluster([rank_node("head", 0, [9]), rank_node("worker", 1, worker_mem)])


def readiness_ready_at_poll(monkeypatch, profile, plan, worker_mem: list[float], polls: int) -> server.StartResult:
    """``server._readiness`` over :func:`start_nodes` (9 GiB before launch on both), the probe ready at poll
    ``polls`` (0.3 s apart), memory sampled every 0.05 s; nothing may be stopped."""
    seen = []

    def ready_on_poll(profile, url, api_key, ready, t0):
        seen.append(1)
        if len(seen) >= polls:
            for ph in server.PHASES:
                setattr(ready, ph, 1.0)
            ready.models_detail = "tiny"
    monkeypatch.setattr(server, "stop", lambda *a, **k: pytest.fail("nothing to stop"))
    monkeypatch.setattr(server, "probe_readiness", ready_on_poll)
    monkeypatch.setattr(server, "POLL_S", 0.3)
    monkeypatch.setattr(memguard, "MEM_POLL_S", 0.05)
    result = server.StartResult(plan=plan, base_url="http://x", mem_before={"head": 9 * GIB, "worker": 9 * GIB})
    server._readiness(start_nodes(worker_mem), profile, plan, result, "http://x", "", lambda n, t: n, True,
                      cleanup=True, t0=time.monotonic(), started=True)
    return result
