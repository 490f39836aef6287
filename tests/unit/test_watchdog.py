"""The serving watchdog's alert: its "N s" counts from the stall's start, and a frozen rank (process stopped,
state T) is named instead of "every rank running" (issue 25, lab runs of test_watchdog_lab.py)."""
from __future__ import annotations

from pathlib import Path

from runbook.checks import check
from runbook.api import health, watchdog
from runbook.profile import load_profile
from support.doubles import FakeCluster, rank_node

ENV = Path(__file__).resolve().parents[2] / "env"


def _metrics(count: float, busy: float) -> str:
    return (f"# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{{model_name=\"m\"}} {count}\n"
            f"vllm:prompt_tokens_total{{model_name=\"m\"}} 0\n"
            f"vllm:num_requests_running{{model_name=\"m\"}} {busy}\nvllm:num_requests_waiting{{model_name=\"m\"}} 0\n")


class _Exchange:
    def __init__(self, body: str):
        self.status, self.body, self.error = 200, body, ""


def test_the_alert_counts_from_the_stall_not_from_the_watch_start(monkeypatch):
    """Scrapes every 10 s (a fake clock): tokens move until 30 s, then stop with a request running. With a
    20 s limit the alert fires at 50 s into the watch, 20 s after the stall began, and says 20 s."""
    clock = {"t": 0.0}
    script = iter([_metrics(10, 1), _metrics(20, 1), _metrics(30, 1)] + [_metrics(30, 1)] * 50)

    class FakeApi:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def get(self, path):
            assert path == "/metrics"
            clock["t"] += 10.0
            return _Exchange(next(script))

    monkeypatch.setattr(watchdog, "ApiClient", FakeApi)
    monkeypatch.setattr(watchdog.time, "monotonic", lambda: clock["t"])
    lines: list[str] = []
    profile = load_profile(ENV / "lab.env", {"API_HOST": "0.0.0.0"})     # no SSH forward to open
    dog = watchdog.Watchdog(profile, interval_s=0.001, stall_s=20, check_nodes=False,
                            echo=lines.append).start()
    for _ in range(2000):
        if dog.alerts:
            break
        watchdog.threading.Event().wait(0.005)
    dog.stop()
    assert dog.alerts, "the watchdog never fired"
    a = dog.alerts[0]
    assert (a.kind, a.at_s, a.since_s, a.after_s) == ("wedge", 50.0, 30.0, 20.0)
    row = dog.check()
    assert row.failed and row.observed.startswith("wedge 20 s after it began (stalled since 30 s into the watch)")
    assert "wedge 20 s after it began" in lines[0] and "50 s" not in lines[0]


def test_a_frozen_rank_is_named_in_its_row_and_in_the_alert():
    profile = load_profile(ENV / "lab.env", {"PORT": "1", "API_HOST": "0.0.0.0"})   # nothing answers there
    head_ps = ("  10    10 Sl   /v/bin/python /repo/runbook/lab/vllm_cli.py serve /m --port 8000\n"
               "  11    10 Sl   VLLM::EngineCore\n")
    worker_ps = ("  20    20 Tl   /v/bin/python /repo/runbook/lab/vllm_cli.py serve /m --headless\n"
                 "  21    20 Tl   VLLM::Worker_TP1\n")

    cluster = FakeCluster([rank_node("head", 0, pid=10, fingerprint="fp-1", ps=head_ps),
                           rank_node("worker", 1, pid=20, fingerprint="fp-1", ps=worker_ps)])
    rows = health.server_rows(cluster, profile)
    frozen = [r for r in rows if r.name == "rank not frozen"]
    assert len(frozen) == 1 and frozen[0].node == "worker" and frozen[0].failed
    assert "20 " in frozen[0].observed and "21 VLLM::Worker_TP1" in frozen[0].observed
    assert "kill -CONT" in frozen[0].fix and "runbook stop" in frozen[0].fix
    # issue 37 item 6: the exact command (the profile's ssh line, the frozen pids) and how to tell who stopped them
    assert "ssh -F .lab/ssh_config" in frozen[0].fix and "spark-worker kill -CONT 20 21" in frozen[0].fix
    assert "TracerPid" in frozen[0].fix
    running = {r.node: r for r in rows if r.name == "rank running"}
    assert not running["worker"].failed and "frozen (state T)" in running["worker"].observed
    alert = watchdog.Alert(40.0, "wedge", "1 request(s) running", rows, since_s=20.0)
    assert "rank not frozen@worker" in alert.explanation() and "every rank running" not in alert.explanation()


def test_the_explanation_says_every_rank_running_only_when_it_was_checked():
    ok = [check("fabric link up", True, node="head"), check("rank running", True, node="worker")]
    assert watchdog.Alert(30.0, "wedge", "x", ok, 10.0).explanation().startswith("fabric up and pingable")
    assert watchdog.Alert(30.0, "wedge", "x", [], 10.0).explanation() == "fabric and ranks not checked"


def test_watching_hands_its_row_to_the_callback_and_runs_nothing_in_a_dry_run(monkeypatch):
    """``watching(profile, add)``: the block's "serving watchdog" row goes to ``add`` when the block ends
    (the step's run passes ``step.add``); a dry run starts no watchdog and adds no row."""
    class FakeApi:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def get(self, path):
            assert path == "/metrics"
            return _Exchange(_metrics(10, 0))

    monkeypatch.setattr(watchdog, "ApiClient", FakeApi)
    profile = load_profile(ENV / "lab.env", {"API_HOST": "0.0.0.0"})     # no SSH forward to open
    rows: list = []
    with watchdog.watching(profile, rows.append, dry_run=True) as dog:
        assert dog is None
    assert rows == []
    with watchdog.watching(profile, rows.append, interval_s=0.001, check_nodes=False) as dog:
        for _ in range(2000):
            if dog.scrapes:
                break
            watchdog.threading.Event().wait(0.005)
    (row,) = rows
    assert row.name == "serving watchdog" and row.status.value == "PASS" and dog.scrapes > 0
