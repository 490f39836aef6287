import pytest

from runbook.checks import Check, CheckList, Status, check, not_applicable
from runbook.errors import CheckFailed


def test_check_from_bool_sets_status_and_hides_fix_on_pass():
    ok = check("mtu", True, node="head", observed=9000, expected=9000, fix="set mtu")
    bad = check("mtu", False, node="worker", observed=1500, expected=9000, fix="set mtu 9000")
    warn = check("rtt", False, warn_only=True, observed="3 ms", expected="< 1 ms")
    assert (ok.status, ok.fix) == (Status.PASS, "")
    assert (bad.status, bad.fix, bad.observed) == (Status.FAIL, "set mtu 9000", "1500")
    assert warn.status is Status.WARN and not warn.failed


def test_not_applicable_is_never_a_pass():
    na = not_applicable("rdma bandwidth", "no RDMA on this profile", node="head")
    assert na.status is Status.NA and na.status is not Status.PASS and not na.failed


def test_raise_on_failure_names_every_failed_check_and_the_first_fix():
    checks = CheckList([check("a", True), check("b", False, node="worker", observed="1500", expected="9000",
                                                  fix="ip link set mtu 9000"),
                        check("c", False, node="head", fix="other")])
    with pytest.raises(CheckFailed) as err:
        checks.raise_on_failure("01_network")
    text = str(err.value)
    assert "2 check(s) failed" in text and "b@worker" in text and "c@head" in text
    assert "ip link set mtu 9000" in text and "observed: 1500" in text


def test_raise_on_failure_passes_with_warn_and_na():
    CheckList([check("a", False, warn_only=True), not_applicable("b", "lab")]).raise_on_failure()


def test_records_round_trip_and_counts():
    checks = CheckList([check("a", True, data={"gbps": 12.5}), not_applicable("b", "lab"),
                        Check("c", status=Status.NOOP)])
    again = CheckList.from_records(checks.to_records())
    assert again == checks
    assert again.counts()["N/A"] == 1 and again.counts()["PASS"] == 1 and again.counts()["NO-OP"] == 1


def test_text_and_frame_rendering():
    checks = CheckList([check("mtu", False, node="worker", observed="1500", expected="9000", fix="fix it")])
    text = checks.to_text()
    assert "FAIL" in text.splitlines()[1] and "worker" in text
    frame = checks.to_frame()
    assert list(frame.columns) == ["name", "node", "status", "observed", "expected", "fix"]
    assert frame.iloc[0]["status"] == "FAIL"
