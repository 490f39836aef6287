"""`make test`'s scheduling (``support.lab_group.in_lab_group``, asked by tests/conftest.py's scheduler): which tests wait for the lab group's one worker."""
from __future__ import annotations


from support import lab_group
from support.lab_group import in_lab_group

TESTS = lab_group.TESTS
# the marks spelled in two parts: the scheduler reads marks from a file's text, and this file is neither
TIMED, OWN = "pytest.mark." + "timed", "pytest.mark." + "own_netns"


def test_embedded_lab_tests_and_timed_unit_tests_are_in_the_lab_group():
    timed = sorted(p for p in (TESTS / "unit").glob("test_*.py") if TIMED in p.read_text())
    assert timed, "no unit test file marks itself timed"
    for nodeid in ["tests/lab/test_four_nodes.py::test_four_nodes_on_a_switch_pass_every_step_at_tp4",
                   "tests/lab/test_full_runbook.py::test_every_step_passed",
                   f"tests/unit/{timed[0].name}::test_x"]:
        assert in_lab_group(nodeid), nodeid


def test_own_netns_lab_files_and_plain_unit_tests_run_beside_it():
    own = sorted(p for p in (TESTS / "lab").glob("test_*.py") if OWN in p.read_text())
    assert [p.name for p in own] == ["test_ray_cluster_lab.py"]
    assert not in_lab_group("tests/lab/test_ray_cluster_lab.py::test_x")
    assert not in_lab_group("tests/unit/test_lab_group.py::test_x")
