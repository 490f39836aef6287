"""Issue 37 item 1: a run passes only if 05-07's evidence belongs to the server start the run ends with. 04 records
which start of the server it made (``LaunchRecord.server_id``, from the head's rank record), 05-07 record the one
they measured (``data.server.server_id``), and the run folder, the runner and the report compare them."""
from __future__ import annotations

import json

from runbook.evidence import RunDir
from runbook.launch.server import server_id
from runbook.records import LaunchRank, LaunchRecord
from runbook.report import collector
from runbook.report.nextstep import headline_text, reasons, what_next
from support.runs import build_run


def launch_record(sid: str) -> LaunchRecord:
    return LaunchRecord(fingerprint="f" * 64, served_model_name="tiny", max_model_len=4096, base_url="http://h:8000",
                        ranks=(LaunchRank(node="head", rank=0, headless=False),), server_id=sid)


def test_server_id_is_one_start_of_the_server():
    assert server_id({"run_id": "20261205-lab", "started_at": 1764900000.123456}) == "20261205-lab@1764900000.123"
    assert server_id({"run_id": "x"}) == ""                 # a record without a start time identifies nothing


def test_a_step_measured_on_an_earlier_start_is_named_and_the_report_does_not_call_the_run_a_pass(tmp_path):
    run = build_run(tmp_path / "results", "20261201-040000-lab")
    rd = RunDir(run)
    launch = rd.read_sidecar("04_launch")
    rd.write_sidecar("04_launch", launch["checks"], launch["data"], "passed", launch_record("runB@200.000"))
    smoke = rd.read_sidecar("05_smoke") or {"checks": [], "data": {}}
    rd.write_sidecar("05_smoke", smoke["checks"], {**smoke["data"], "server": {"server_id": "runA@100.000"}}, "passed")
    other = rd.evidence_of_other_servers()
    assert list(other) == ["05_smoke"] and other["05_smoke"].startswith(
        "05_smoke was measured on server start runA@100.000, the run ends with runB@200.000")
    man = json.loads((run / "manifest.json").read_text())
    assert man["status"] == "passed"
    model = collector.collect(run, drift=False)
    assert model.other_servers == other
    assert "not a pass" in headline_text(model)
    assert any(text.startswith("05_smoke was measured") for _, text in reasons(model))
    nxt = what_next(model)
    assert nxt.kind == "fix" and nxt.title.startswith("Re-run 05_smoke") and "--from 05 --resume" in nxt.command


def test_the_same_start_or_no_identity_is_not_judged(tmp_path):
    run = build_run(tmp_path / "results", "20261201-040000-lab")
    rd = RunDir(run)
    launch = rd.read_sidecar("04_launch")
    rd.write_sidecar("04_launch", launch["checks"], launch["data"], "passed", launch_record("runB@200.000"))
    smoke = rd.read_sidecar("05_smoke") or {"checks": [], "data": {}}
    rd.write_sidecar("05_smoke", smoke["checks"], {**smoke["data"], "server": {"server_id": "runB@200.000"}}, "passed")
    assert rd.evidence_of_other_servers() == {}
    rd.write_sidecar("04_launch", launch["checks"], launch["data"], "passed", launch_record(""))   # an older 04
    assert rd.evidence_of_other_servers() == {}
    assert "not a pass" not in headline_text(collector.collect(run, drift=False))
