"""Issue 25, "prevent: memory", on the lab: memory pressure during a start aborts it before the node stops
answering, and names the cause.

The lab's nodes are network namespaces of one host: they share its kernel, so MemAvailable is the host's on every
node. The test sets the floor 3 GiB below the live MemAvailable and, once both ranks are launched, a balloon
process on that host (a python that allocates and touches memory) takes MemAvailable just below the floor. The
balloon is capped. It never allocates past 1 GiB below the floor, nor more than 5 GiB in all, so the host keeps
most of its memory. It holds for a few seconds, then exits by itself, and the test kills it in any case. The
start must fail on the guard's row, naming the rank, the value, the floor and the cause, within a few seconds of
the crossing. Every node must still answer, no rank may be left, and the memory must come back: the abort's
stop rows PASS and no "reboot needed" record stays on a node.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_launch_lab
from test_launch_lab import VENV, _assert_nothing_left, _profile

from runbook.facts import ranks, system
from runbook.launch import memguard, server
from runbook.launch.plan import render_plan
from runbook.launch.stop import MEM_ROW
from runbook.remote import quote

# step 04's lab fixtures, shared: the lab cluster with a clean start, the tiny model on every node, the stop after
cluster, tiny_model, stop_after = test_launch_lab.cluster, test_launch_lab.tiny_model, test_launch_lab.stop_after

pytestmark = [pytest.mark.lab, pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(not (VENV / "bin" / "python").exists(),
                                 reason=f"{VENV} missing: make lab-vllm installs the lab's CPU vLLM")]

GIB = 1024 ** 3
BELOW_LIVE_GIB = 3.0        # the floor: this far below the live MemAvailable
BALLOON_CAP_GIB = 5.0       # the balloon never holds more than this (and never allocates below floor - 1 GiB)
HOLD_S = 6.0                # ... and holds it this long once below its target, then exits

# argv: target_kb (stop growing below it), never_below_kb (never allocate past it), cap_bytes, hold_s, life_s,
# floor_kb, crossed_file (gets time.monotonic() when MemAvailable first went below the floor)
BALLOON = r"""
import sys, time
target_kb, never_below_kb, cap, floor_kb = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[6])
hold_s, life_s, crossed_file = float(sys.argv[4]), float(sys.argv[5]), sys.argv[7]
CHUNK = 64 << 20
def avail_kb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
held, crossed, reached, t0 = [], None, None, time.monotonic()
while time.monotonic() - t0 < life_s:
    if reached is not None and time.monotonic() - reached > hold_s:
        break                                   # held long enough, whatever MemAvailable does now
    a = avail_kb()
    if a < floor_kb and crossed is None:
        crossed = time.monotonic()
        open(crossed_file, "w").write(repr(crossed))
    if a < target_kb:
        reached = reached or time.monotonic()
    elif a - CHUNK // 1024 > never_below_kb and (len(held) + 1) * CHUNK <= cap:
        b = bytearray(CHUNK)
        b[::4096] = b"\x01" * (CHUNK // 4096)       # touch every page: resident, not just reserved
        held.append(b)
        continue
    time.sleep(0.05)
"""


def _live_mem_available() -> int:
    return system.parse_meminfo(Path("/proc/meminfo").read_text())["MemAvailable"]


def test_memory_pressure_during_a_start_aborts_it_before_the_node_stops_answering(cluster, tiny_model, stop_after,
                                                                                 tmp_path):
    live = _live_mem_available()
    if live < 10 * GIB:
        pytest.skip(f"the lab host has {live / GIB:.1f} GiB MemAvailable: too little to take 3 GiB of it safely")
    floor = live - int(BELOW_LIVE_GIB * GIB)
    profile = _profile(MEM_FLOOR_GIB=f"{floor / GIB:.2f}")
    floor = int(profile.mem_floor_gib * GIB)                      # as the guard reads it (2 decimals)
    plan = render_plan(cluster, profile)
    crossed_file = tmp_path / "crossed"
    balloon: list[subprocess.Popen] = []

    def inflate():              # both ranks launched: the guard starts next
        balloon.append(subprocess.Popen(
            [sys.executable, "-c", BALLOON, str((floor - GIB // 2) // 1024), str((floor - GIB) // 1024),
             str(int(BALLOON_CAP_GIB * GIB)), str(HOLD_S), "60", str(floor // 1024), str(crossed_file)]))

    t0 = time.monotonic()
    try:
        result = server.start(cluster, profile, plan, raise_on_failure=False, on_launched=inflate)
        took = time.monotonic() - t0
        answers = {n.name: n.read("true", timeout=10).ok for n in cluster}
    finally:
        for p in balloon:
            p.kill()
            p.wait(timeout=30)
    print(f"\n[memory guard] live {live / GIB:.2f} GiB, floor {floor / GIB:.2f} GiB; start ended after {took:.1f} s; "
          f"guard: {result.memory_guard.get('breach')}; minimum: {result.memory_guard.get('minimum')}")
    try:
        failed = result.checks.failures()
        assert failed and failed[0].name == memguard.GUARD_ROW, result.checks.to_text()
        row = failed[0]
        assert row.node in ("head", "worker")
        assert "MemAvailable" in row.observed and f"floor {floor / GIB:.2f} GiB" in row.observed, row.observed
        assert "gpu-memory-utilization" in row.observed and "page cache" in row.observed, row.observed
        assert "KV_CACHE_MEMORY_BYTES" in row.fix and "GPU_MEM_UTIL" in row.fix
        # found within two samples of the crossing (the balloon wrote when MemAvailable went below the floor)
        assert crossed_file.exists(), "the balloon never saw MemAvailable below the floor"
        detected = result.failure_detected_at - float(crossed_file.read_text())
        assert detected <= 2 * memguard.MEM_POLL_S + 1.0, detected
        # every node answered every sample and answers now; nothing is left running
        assert answers == {"head": True, "worker": True}, answers
        assert all(m["misses"] == 0 for m in result.memory_guard["minimum"].values()), result.memory_guard
        _assert_nothing_left(cluster, profile)
        # the balloon gone, the memory came back: the abort's stop says so and leaves no record
        back = [c for c in result.checks if c.name == MEM_ROW]
        assert back and all(c.status.value == "PASS" for c in back), [c.to_record() for c in back]
        assert took < 90, took
    finally:
        for n in cluster:             # a record of a failed assertion above must not refuse the next test's start
            home = n.read('printf %s "$HOME"').stdout.strip() or "/root"
            n.run(f"rm -f {quote(ranks.pin_path(profile, home, n.name))}", timeout=30, warn=True)
