"""The start's memory guard (issue 25, "prevent: memory"): the PSI parser on captured text, the one-read sample,
the abort floor, the guard's thread, the refusal to launch into a pool a previous stop left smaller, and the stop's
"reboot needed" row with the record it leaves on the node."""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from support.doubles import FakeCluster, FakeNode
from support.memnodes import GIB, readiness_ready_at_poll, sample_text, sampling_node, start_nodes
from test_launch_render import _plan

from runbook.errors import ActionError
from runbook.facts import ranks, system
from runbook.launch import memguard, server, stop
from runbook.launch.stop import MEM_ROW, StopResult
from runbook.profile import REPO_ROOT, load_profile

DATA = Path(__file__).parent / "data" / "psi"
HOME = "/home/spark"


def profile(**over):
    return load_profile(REPO_ROOT / "env" / "lab.env", {k: str(v) for k, v in over.items()})


# ----------------------------------------------------------------------------- parsers

def test_psi_parser_reads_the_kernels_text_captured_on_a_host():
    idle = system.parse_psi((DATA / "memory.txt").read_text())
    assert idle is not None and set(idle) == {"some", "full"}
    assert idle["full"].avg10 == 0.0 and idle["full"].total_us == 0
    busy = system.parse_psi((DATA / "io.txt").read_text())     # same format, non-zero figures
    assert busy is not None
    assert (busy["some"].avg10, busy["some"].avg60, busy["some"].avg300) == (0.33, 1.10, 2.01)
    assert busy["full"].avg10 == 0.02 and busy["full"].total_us == 99746257


@pytest.mark.parametrize("text", ["", "\n", "cat: /proc/pressure/memory: Operation not supported", "some avg10=x"])
def test_no_psi_is_none_not_zero(text):
    assert system.parse_psi(text) is None
    s = system.parse_mem_sample(["1024", text])
    assert s.mem_available == 1024 * 1024 and s.psi_some is None and s.psi_full is None and not s.psi


def test_the_sample_command_reads_memavailable_and_psi_in_one_read_and_says_so_when_psi_is_absent(tmp_path):
    """Run for real: MemAvailable agrees with /proc/meminfo; with the PSI file absent the second line is empty
    (no error text mistaken for a value) and the sample says there is no PSI."""
    out = subprocess.run(["bash", "-c", system.MEM_SAMPLE_CMD], capture_output=True, text=True, timeout=30)
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and out.stderr == ""
    s = system.parse_mem_sample(lines)
    meminfo = system.parse_meminfo(Path("/proc/meminfo").read_text())["MemAvailable"]
    assert s.mem_available is not None and abs(s.mem_available - meminfo) < 2 * GIB
    assert s.psi == Path(system.PSI_MEMORY).exists()
    absent = system.MEM_SAMPLE_CMD.replace(system.PSI_MEMORY, str(tmp_path / "no-such-pressure-file"))
    for shell in ("bash", "sh"):
        out = subprocess.run([shell, "-c", absent], capture_output=True, text=True, timeout=30)
        assert out.stderr == "" and out.stdout.splitlines()[1] == ""
        s = system.parse_mem_sample(out.stdout.splitlines())
        assert s.mem_available is not None and not s.psi and s.psi_full is None


def test_the_start_watch_parses_memory_then_liveness():
    node = FakeNode("head", 0, read_only=True, rules=[
        (re.escape(ranks.MEM_LINE), sample_text(10.5, 1.25, 0.5) + "alive\n17\nINFO a\nINFO b")])
    w = ranks.watch(node, _plan("lab").rank("head"))
    assert w.alive and w.lines == 17 and w.tail == ["INFO a", "INFO b"]
    assert w.mem_available == int(10.5 * GIB) // 1024 * 1024 and w.psi_full == 0.5


# ----------------------------------------------------------------------------- the floor

@pytest.mark.parametrize("mem,full,floor,psi_max,what", [
    (3.9, 0.0, 4, 25, "floor"),
    (4.0, 0.0, 4, 25, None),             # at the floor is not below it
    (8.0, 30.0, 4, 25, "psi"),
    (3.0, 30.0, 4, 25, "floor"),         # both: the floor is named
    (1.0, 90.0, 0, 0, None),             # both limits off
    (8.0, None, 4, 25, None),            # no PSI on this kernel: only the floor applies
])
def test_breach_of(mem, full, floor, psi_max, what):
    s = system.MemSample(int(mem * GIB), None if full is None else 0.0, full)
    b = memguard.breach_of("worker", 12.0, s, int(floor * GIB), psi_max)
    assert (b.what if b else None) == what
    if b and what == "floor":
        assert "worker" in b.observed() and f"{mem:.2f} GiB" in b.observed() and "MEM_FLOOR_GIB" in b.observed()
    if b and what == "psi":
        assert "MEM_PSI_FULL_MAX" in b.observed() and "30.00 %" in b.observed()


def test_the_guard_stops_at_the_first_sample_below_the_floor_and_records_the_minimum():
    head = sampling_node("head", 0, [9, 8, 8])
    worker = sampling_node("worker", 1, [9, 6, 3.5, 2.0], psi=False)
    cluster = FakeCluster([head, worker])
    calls = []
    guard = memguard.MemoryGuard(cluster, profile(MEM_FLOOR_GIB=4), time.monotonic(), period=0.02,
                                 on_breach=lambda own, b: calls.append((own, b.node)) or "stopped")
    guard.start()
    assert guard.breached.wait(10), "the guard never saw the worker cross the floor"
    guard.close()
    assert calls == [(cluster, "worker")] and guard.stopped == "stopped"
    b = guard.breach
    assert b.node == "worker" and b.what == "floor" and b.value == int(3.5 * GIB) // 1024 * 1024
    reads = len(worker.reads())
    time.sleep(0.1)
    assert len(worker.reads()) == reads == 3         # sampling ended at the breach
    m = guard.minimum({"head": 10 * GIB, "worker": 10 * GIB})
    assert m["worker"]["min_mem_available"] == b.value and m["worker"]["psi"] is False
    assert m["head"]["min_mem_available"] == 8 * GIB and m["head"]["max_psi_full"] == 1.5
    rows = {r.node: r for r in guard.minimum_rows({"head": 10 * GIB})}
    assert rows["head"].status.value == "PASS" and rows["worker"].status.value == "WARN"
    assert "no memory PSI on this kernel" in rows["worker"].observed
    what, node, observed, fix = guard.breach_row_text()
    assert node == "worker" and "3.50 GiB" in observed and "floor 4.00 GiB" in observed
    assert "gpu-memory-utilization" in observed and "page cache" in observed
    assert "KV_CACHE_MEMORY_BYTES" in fix and "reboot" in fix
    assert "every rank stopped by the guard at once" in observed and "failed" not in observed


def test_a_breach_the_guard_did_not_stop_never_says_its_stop_failed():
    """Issue 37 item 6: a breach with no stop of the guard's own read 'the guard's stop failed (None)'."""
    guard = memguard.MemoryGuard(FakeCluster([FakeNode("head", 0), FakeNode("worker", 1)]), profile(MEM_FLOOR_GIB=4),
                                 0.0)
    from runbook.facts.system import MemSample
    guard.breach = memguard.Breach("worker", 12.0, "floor", float(3 * GIB), float(4 * GIB),
                                   MemSample(mem_available=3 * GIB))
    _, _, observed, _ = guard.breach_row_text()
    assert "None" not in observed and "stop failed" not in observed and "the start stops every rank now" in observed


def test_the_guard_samples_at_its_own_pace_and_counts_a_node_that_does_not_answer():
    head = sampling_node("head", 0, [9])
    worker = FakeNode("worker", 1, read_only=True, rules=[
        (re.escape(system.MEM_SAMPLE_CMD), ActionError("no answer"))])
    guard = memguard.MemoryGuard(FakeCluster([head, worker]), profile(), time.monotonic(), period=0.3).start()
    deadline = time.monotonic() + 20
    while len(guard.samples["head"]) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    guard.close()
    times = [s[0] for s in guard.samples["head"]]
    assert guard.breach is None and len(times) >= 5
    assert all(b - a >= 0.2 for a, b in zip(times, times[1:])), times       # paced, not a busy loop
    assert guard.misses["worker"] == len(worker.reads()) >= 4
    rows = {r.node: r for r in guard.minimum_rows({})}
    assert rows["worker"].status.value == "WARN" and "no sample answered" in rows["worker"].observed


# ----------------------------------------------------------------------------- the start

def test_a_start_whose_rank_crosses_the_floor_is_aborted_at_once_with_the_cause(monkeypatch):
    """The readiness probe blocks for 3 s (the first request can run a minute): the guard's thread still samples
    every period, stops the ranks at the crossing, and the start fails naming the rank, the value, the floor
    and the cause; the ranks are stopped once (by the guard), not again by the failure's cleanup."""
    prof = profile(MEM_FLOOR_GIB=4)
    plan = _plan("lab")
    stopped_at = []

    def fake_stop(cluster, profile, nodes=None, *, grace=30.0, mem_settle_s=20.0, first=""):
        stopped_at.append((time.monotonic(), grace, first))
        out = StopResult()
        out.checks.add(stop.check(MEM_ROW, True, node="worker", observed="9.00 GiB (before launch 9.00 GiB)"))
        return out
    probe_returned = []

    def slow_probe(*a, **k):
        time.sleep(3)
        probe_returned.append(time.monotonic())
    monkeypatch.setattr(server, "stop", fake_stop)
    monkeypatch.setattr(server, "probe_readiness", slow_probe)
    monkeypatch.setattr(memguard, "MEM_POLL_S", 0.05)
    cluster = start_nodes([9, 7, 5, 3.2])
    result = server.StartResult(plan=plan, base_url="http://x")
    t0 = time.monotonic()
    with pytest.raises(ActionError) as err:
        server._readiness(cluster, prof, plan, result, "http://x", "", lambda n, t: n, True, cleanup=True, t0=t0,
                          started=True)
    assert len(stopped_at) == 1 and stopped_at[0][1:] == (server.ABORT_GRACE_S, "worker")   # the crossing rank first
    assert stopped_at[0][0] < probe_returned[0], "the guard waited for the readiness probe"
    row = next(c for c in result.checks if c.name == memguard.GUARD_ROW)
    assert row.failed and row.node == "worker"
    assert "MemAvailable 3.20 GiB" in row.observed and "floor 4.00 GiB" in row.observed
    assert "gpu-memory-utilization" in row.observed and "KV_CACHE_MEMORY_BYTES" in row.fix
    assert "MemAvailable >= 4.00 GiB" in row.expected
    assert result.failure_detected_s is not None and result.failure_detected_s < 2.5
    guard = result.memory_guard
    assert guard["breach"]["node"] == "worker" and guard["minimum"]["worker"]["min_mem_available"] < 4 * GIB
    assert result.memory_profile["worker"][-1][1] == guard["breach"]["value"]
    assert [c.name for c in result.checks if c.name == MEM_ROW] == [MEM_ROW]      # the abort's stop rows
    assert "worker" in err.value.what


def test_a_start_that_stays_above_the_floor_records_the_minimum_per_rank(monkeypatch):
    result = readiness_ready_at_poll(monkeypatch, profile(MEM_FLOOR_GIB=4), _plan("lab"), [9, 6.5, 5, 7], 5)
    rows = {c.node: c for c in result.checks if c.name == memguard.MIN_ROW}
    assert sorted(rows) == ["head", "worker"] and all(r.status.value == "PASS" for r in rows.values())
    assert "5.00 GiB" in rows["worker"].observed and "before launch 9.00 GiB" in rows["worker"].observed
    assert result.memory_guard["breach"] is None and result.data()["memory_guard"]["minimum"]["worker"][
        "min_mem_available"] == 5 * GIB
    assert len(result.memory_profile["head"]) >= 5           # the guard's pace, not the 0.3 s poll's
    assert result.data()["memory_psi"]["head"][0][1:] == [0.5, 1.5]


# ----------------------------------------------------------------------------- the next start

def _state_node(name, rank, *, live_gib, pin=None, refuse_runs=False):
    path = ranks.pin_path(profile(), HOME, name)
    answer = (json.dumps(pin) if pin else "") + "\n@@\n" + sample_text(live_gib)
    rules = [(r"^cat " + re.escape(path) + r" 2>/dev/null; echo; echo '@@'; " + re.escape(system.MEM_SAMPLE_CMD)
              + r"\Z", answer, "read")]
    if not refuse_runs:
        rules.append((r"^rm -f " + re.escape(path) + r"\Z", "", "run"))
    return FakeNode(name, rank, rules=rules), path


def test_the_next_start_refuses_to_launch_into_the_pool_a_stop_left_smaller():
    pin = {"baseline": 110 * GIB, "after": 70 * GIB, "tolerance": 5 * GIB, "stopped_at": 1_764_700_000,
           "run_id": "20261203-101010"}
    head, _ = _state_node("head", 0, live_gib=111)
    worker, path = _state_node("worker", 1, live_gib=72, pin=pin, refuse_runs=True)
    pre = memguard.pre_launch(FakeCluster([head, worker]), profile(), {"head": HOME, "worker": HOME})
    assert [c.node for c in pre.refused] == ["worker"] and not pre.rows
    row = pre.refused[0]
    assert row.name == memguard.POOL_ROW and row.failed
    assert "72.00 GiB" in row.observed and "110.00 GiB" in row.observed and "20261203-101010" in row.observed
    assert ">= 105.00 GiB" in row.expected
    assert "reboot worker" in row.fix and path in row.fix
    assert pre.mem_before == {"head": 111 * GIB, "worker": 72 * GIB}
    assert worker.runs() == []                                     # the record stays until the memory is back


def test_a_record_whose_memory_is_back_is_removed_and_the_start_goes_on():
    pin = {"baseline": 110 * GIB, "after": 70 * GIB, "tolerance": 5 * GIB, "stopped_at": 1_764_700_000}
    head, _ = _state_node("head", 0, live_gib=111)
    worker, path = _state_node("worker", 1, live_gib=106, pin=pin)
    pre = memguard.pre_launch(FakeCluster([head, worker]), profile(), {"head": HOME, "worker": HOME})
    assert not pre.refused and [c.node for c in pre.rows] == ["worker"] and pre.rows[0].status.value == "PASS"
    assert worker.runs() == [f"rm -f {path}"] and head.runs() == []


def test_a_node_already_below_the_floor_is_refused_before_launch():
    head, _ = _state_node("head", 0, live_gib=3)
    worker, _ = _state_node("worker", 1, live_gib=12)
    pre = memguard.pre_launch(FakeCluster([head, worker]), profile(MEM_FLOOR_GIB=4), {"head": HOME, "worker": HOME})
    assert [(c.name, c.node) for c in pre.refused] == [(memguard.FLOOR_ROW, "head")]
    assert "3.00 GiB" in pre.refused[0].observed and "4.00 GiB" in pre.refused[0].expected
    off = memguard.pre_launch(FakeCluster([_state_node("head", 0, live_gib=3)[0], worker]),
                              profile(MEM_FLOOR_GIB=0), {"head": HOME, "worker": HOME})
    assert not off.refused


# ----------------------------------------------------------------------------- the stop

def _mem_node(values_gib, pin_path):
    seq = list(values_gib)
    written = []

    def meminfo(cmd):
        v = seq.pop(0) if len(seq) > 1 else seq[0]
        return f"MemTotal: 125000000 kB\nMemAvailable: {int(v * GIB) // 1024} kB\n"

    def write(cmd):
        written.append(cmd)
        return ""
    node = FakeNode("worker", 1, rules=[(r"^cat /proc/meminfo\Z", meminfo, "read"),
                                        (r"^mkdir -p .* > " + re.escape(pin_path) + r"\Z", write, "run"),
                                        (r"^rm -f " + re.escape(pin_path) + r"\Z", "", "run")])
    return node, written


@pytest.mark.parametrize("settle,status", [(0, "WARN"), (0.2, "FAIL")])
def test_memory_not_back_after_a_stop_says_reboot_needed_and_leaves_the_record(monkeypatch, settle, status):
    monkeypatch.setattr(stop.time, "sleep", lambda s: None)
    path = f"{HOME}/.cache/spark-runbook/launch/worker{ranks.PIN_SUFFIX}"
    node, written = _mem_node([80, 81, 82], path)
    info = {"mem_available_before": 110 * GIB, "pin_path": path, "run_id": "r1"}
    row, after = stop._mem_check(node, info, settle)
    assert row.status.value == status
    assert after == (82 * GIB if settle else 80 * GIB)          # waited for it to come back / read once
    assert "110.00 GiB" in row.observed and "reboot" in row.fix and path in row.fix
    if status == "FAIL":
        assert "reboot needed" in row.observed
    assert len(written) == 1
    rec = json.loads(re.search(r"printf '%s\\n' '(.*)' > ", written[0]).group(1))
    assert rec["baseline"] == 110 * GIB and rec["run_id"] == "r1" and rec["tolerance"] == stop.tolerance(110 * GIB)


def test_memory_back_after_a_stop_passes_and_removes_an_old_record(monkeypatch):
    path = f"{HOME}/.cache/spark-runbook/launch/worker{ranks.PIN_SUFFIX}"
    node, written = _mem_node([109], path)
    row, _ = stop._mem_check(node, {"mem_available_before": 110 * GIB, "pin_path": path}, 20)
    assert row.status.value == "PASS" and not written and node.runs() == [f"rm -f {path}"]


def test_the_tolerance_is_two_gib_or_five_percent():
    assert stop.tolerance(20 * GIB) == 2 * GIB                  # the lab's host
    assert stop.tolerance(119 * GIB) == int(119 * GIB * 0.05)    # a Spark: 5.95 GiB


def test_the_guard_aborts_on_memory_pressure_above_the_ceiling_with_memory_still_above_the_floor():
    """PSI full avg10 is the thrashing signal: a host can stall on memory before MemAvailable reaches the floor."""
    pressured = iter([(2.0, 0.0), (30.0, 12.0), (60.0, 41.5)])
    worker = FakeNode("worker", 1, read_only=True, rules=[
        (re.escape(system.MEM_SAMPLE_CMD), lambda cmd: sample_text(20, *next(pressured)))])
    guard = memguard.MemoryGuard(FakeCluster([sampling_node("head", 0, [20]), worker]),
                                 profile(MEM_FLOOR_GIB=4, MEM_PSI_FULL_MAX=25), time.monotonic(), period=0.02)
    guard.start()
    assert guard.breached.wait(10)
    guard.close()
    b = guard.breach
    assert (b.node, b.what, b.value, b.limit) == ("worker", "psi", 41.5, 25.0)
    assert "41.50 %" in b.observed() and "MemAvailable 20.00 GiB" in b.observed()
    assert guard.minimum({})["worker"]["max_psi_full"] == 41.5


def test_the_abort_stops_the_crossing_rank_first_and_checks_memory_once_every_rank_is_stopped(monkeypatch):
    """On the lab every node reads one host's MemAvailable: a memory check before the last rank is stopped would
    see its memory still held and call for a reboot."""
    events = []
    monkeypatch.setattr(stop, "_stop_node", lambda node, profile, grace: events.append(("stop", node.name)) or ([], {}))
    monkeypatch.setattr(stop, "_mem_check", lambda node, info, settle, shared: events.append(
        ("mem", node.name)) or (stop.check(MEM_ROW, True, node=node.name), 1))
    cluster = FakeCluster([FakeNode("head", 0), FakeNode("worker", 1)])
    stop.stop(cluster, profile(), grace=3, mem_settle_s=20, first="worker")
    assert events == [("stop", "worker"), ("stop", "head"), ("mem", "worker"), ("mem", "head")]
    events.clear()
    stop.stop(cluster, profile(), grace=3, mem_settle_s=20)
    assert events == [("stop", "head"), ("stop", "worker"), ("mem", "head"), ("mem", "worker")]


def test_start_refuses_before_any_rank_runs_when_a_stop_left_the_pool_smaller(monkeypatch):
    """The whole start path: nothing running, ports free, checkout fine; the worker's record says 110 GiB before
    the last start and it has 72 now: refused, read-only nodes (a `run` fails the test), the row names it all."""
    prof = profile()
    plan = _plan("lab")
    pin = {"baseline": 110 * GIB, "after": 70 * GIB, "tolerance": 5 * GIB, "stopped_at": 1_764_700_000}
    nothing = "\n@@\n\n@@\n\n@@\n\n@@\n"

    def node(name, rank, live, rec=None):
        state = _state_node(name, rank, live_gib=live, pin=rec, refuse_runs=True)[0]
        return FakeNode(name, rank, read_only=True, rules=[
            (r'^printf %s "\$HOME"$', HOME),
            (r"^cat \S+/" + name + r"\.pid 2>/dev/null; .*" + re.escape(ranks.PS_CMD) + "$", nothing),
            (re.escape(system.LISTEN_CMD) + r"\Z", ""), *state.rules])
    monkeypatch.setattr(server, "base_url", lambda p: "http://127.0.0.1:8888")
    monkeypatch.setattr(server, "_recipe_checkout", lambda *a, **k: True)
    monkeypatch.setattr(server, "_identity", lambda *a, **k: True)      # its own tests: test_launch_identity.py
    cluster = FakeCluster([node("head", 0, 111), node("worker", 1, 72, pin)])
    result = server.start(cluster, prof, plan, api_key="", raise_on_failure=False)
    failed = result.checks.failures()
    assert [(c.name, c.node) for c in failed] == [(memguard.POOL_ROW, "worker")]
    assert "72.00 GiB" in failed[0].observed and "110.00 GiB" in failed[0].observed
    assert "reboot worker" in failed[0].fix and result.readiness.head_started is None
    assert all(not n.runs() for n in cluster)


def test_the_abort_keeps_docker_ranks_logs_before_the_stop_removes_the_containers(monkeypatch):
    plan = _plan("dspark-v4")
    assert plan.runtime == "docker"
    order = []
    nodes = [FakeNode(n, i, read_only=True, rules=[
        (r"^docker logs --tail 2000 ", lambda cmd, n=n: order.append(f"logs {n}") or f"{n}: Loading weights")])
        for i, n in enumerate(("head", "worker"))]
    monkeypatch.setattr(server, "stop", lambda own, profile, **kw: order.append(f"stop first={kw['first']}") or "s")
    kept: dict[str, str] = {}
    breach = memguard.Breach("worker", 3.0, "floor", 1.0, 2.0, system.MemSample(1))
    assert server._abort(profile(), plan, kept)(FakeCluster(nodes), breach) == "s"
    assert kept == {"head": "head: Loading weights", "worker": "worker: Loading weights"}
    assert order[-1] == "stop first=worker" and len(order) == 3


def test_a_pressure_file_with_one_line_only_is_read_and_shown_without_the_other():
    s = system.parse_mem_sample(["2048", "some avg10=3.50 avg60=1.00 avg300=0.20 total=99"])
    assert (s.psi_some, s.psi_full, s.psi) == (3.5, None, True)
    assert "some 3.50 %" in memguard.Breach("head", 1.0, "floor", 2 * 1024 ** 2, 4 * GIB, s).observed()


def test_a_rank_that_died_is_shown_with_its_memory_at_the_last_sample():
    guard = memguard.MemoryGuard(FakeCluster([FakeNode("head", 0), FakeNode("worker", 1)]), profile(), 0.0)
    assert guard.last_seen("worker") == ""
    guard.samples["worker"] = [[1.5, 9 * GIB, None, None], [3.0, int(0.75 * GIB), None, None],
                               [4.5, 2 * GIB, None, None]]
    assert guard.last_seen("worker") == ("; MemAvailable 2.00 GiB at the last sample (4 s), lowest 0.75 GiB (3 s)")


def test_a_partial_stop_on_the_lab_warns_without_a_record(monkeypatch):
    """The lab's nodes share one host: stopping the worker alone while the head runs cannot bring MemAvailable
    back, and that is no leak."""
    path = f"{HOME}/.cache/spark-runbook/launch/worker{ranks.PIN_SUFFIX}"
    node, written = _mem_node([80], path)
    row, _ = stop._mem_check(node, {"mem_available_before": 110 * GIB, "pin_path": path}, 0, shared=True)
    assert row.status.value == "WARN" and "share one host" in row.observed and not written
    seen = []
    monkeypatch.setattr(stop, "_stop_node", lambda node, profile, grace: ([], {}))
    monkeypatch.setattr(stop, "_mem_check", lambda node, info, settle, shared: seen.append(shared) or (
        stop.check(MEM_ROW, True, node=node.name), 1))
    cluster = FakeCluster([FakeNode("head", 0), FakeNode("worker", 1)])
    stop.stop(cluster, profile(), nodes=["worker"])
    stop.stop(cluster, profile())
    stop.stop(cluster, load_profile(REPO_ROOT / "env" / "dspark-v4.env"), nodes=["worker"])
    assert seen == [True, False, False, False]       # lab worker alone; lab both; a Spark's worker alone
