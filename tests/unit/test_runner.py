import pytest

from runbook.errors import RunbookError
from runbook.runner import discover_steps, select_steps

STEPS = ["00_preflight", "01_network", "02_weights", "03_engram", "04_launch"]


def test_discover_steps_in_order():
    steps = discover_steps()
    assert steps == sorted(steps) and steps[0] == "00_preflight"


def test_select_by_number_name_and_stem():
    assert select_steps(STEPS, start="01", stop="weights") == ["01_network", "02_weights"]
    assert select_steps(STEPS, only=["04_launch", "network"]) == ["04_launch", "01_network"]
    assert select_steps(STEPS, start="03") == ["03_engram", "04_launch"]
    assert select_steps(STEPS) == STEPS


def test_unknown_step_is_named():
    with pytest.raises(RunbookError) as err:
        select_steps(STEPS, only=["99"])
    assert "'99'" in str(err.value) and "00_preflight" in str(err.value)
