"""Step 04's outcome on an exception: ``bring_up`` carries what ran (``err.outcome``) only on the exceptions it means
to (an error, an interrupt), ``run`` records it and re-raises the exception itself, and a refusal raised before
anything ran propagates as itself (before: ``run`` read ``err.outcome`` off every exception, so a refusal surfaced
as an AttributeError)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from support.doubles import FakeCluster
from support.fake_vllm import make_step

import runbook.launch
from runbook.checks import check
from runbook.errors import ProfileError, RemoteError
from runbook.launch import image, selfcheck, server
from runbook.step import StepOutcome

PLAN = SimpleNamespace(to_record=lambda: {"ranks": []}, fingerprint="f" * 64, served_model_name="tiny",
                       max_model_len=256, ranks=())


@pytest.fixture
def launch_step(tmp_path, monkeypatch):
    """Step 04 on the lab profile (not a dry run) over a cluster double with no node: the plan is a stand-in, so
    each test reaches bring_up with nothing connecting."""
    monkeypatch.setenv("VLLM_API_KEY", "test-key-launch-outcome")
    monkeypatch.setattr(runbook.launch, "launch_plan", lambda cluster, profile, network, site=None: PLAN)

    def made(**overrides):
        step = make_step(tmp_path, name="04_launch", overrides=overrides)
        step._cluster = FakeCluster([])
        return step
    return made


def started_with(monkeypatch, raised: BaseException) -> None:
    """The image passes, seed A's self-checks answer a row each, and the start raises ``raised``."""
    monkeypatch.setattr(image, "ensure_image", lambda cluster, profile: image._finish(
        [check("runtime image present", True, node="head")], {"head": "sha256:1"}))
    monkeypatch.setattr(selfcheck, "stamp_check", lambda cluster, profile: check("image recipe stamp", True))
    monkeypatch.setattr(selfcheck, "gpu_selfcheck", lambda cluster, profile: check("image GPU self-check", True))

    def start(*args, **kwargs):
        raise raised
    monkeypatch.setattr(server, "start", start)


def test_a_refusal_propagates_as_itself(launch_step, monkeypatch):
    """EXECUTOR=ray on the lab without its Ray install cannot serve: ``refuse_unservable`` raises before anything
    runs, with no outcome to carry; ``run`` re-raises the ProfileError itself, never an AttributeError about
    ``.outcome``."""
    from runbook.profile import rules
    monkeypatch.setattr(rules, "lab_ray_missing", lambda profile: ["the lab's Ray (.lab/ray-site: make lab-ray)"])
    step = launch_step(EXECUTOR="ray")
    with pytest.raises(ProfileError, match="EXECUTOR") as raised:
        runbook.launch.run(step, action="start")
    assert not hasattr(raised.value, "outcome")
    assert [c.name for c in step.checks] == ["api exposure"]        # only what ran before the refusal


def test_an_error_of_the_start_carries_what_ran_and_run_records_it(launch_step, monkeypatch):
    step = launch_step()
    started_with(monkeypatch, RemoteError("docker run timed out", node="worker"))
    with pytest.raises(RemoteError, match="docker run timed out") as raised:
        runbook.launch.run(step, action="start")
    assert isinstance(raised.value.outcome, runbook.launch.LaunchOutcome)
    assert [c.name for c in step.checks] == ["api exposure", "runtime image present", "image recipe stamp",
                                             "image GPU self-check"]
    assert step.data["image"] == {"head": "sha256:1"}


def test_an_interrupt_carries_what_ran_too(launch_step, monkeypatch):
    step = launch_step()
    started_with(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt) as raised:
        runbook.launch.run(step, action="start")
    assert raised.value.outcome.image is not None and "runtime image present" in [c.name for c in step.checks]


def test_system_exit_carries_nothing(launch_step, monkeypatch):
    """Only the exceptions it means to: an interpreter leaving (SystemExit) passes untouched and nothing is
    recorded from it."""
    step = launch_step()
    started_with(monkeypatch, SystemExit(3))
    with pytest.raises(SystemExit) as raised:
        runbook.launch.run(step, action="start")
    assert not hasattr(raised.value, "outcome")
    assert [c.name for c in step.checks] == ["api exposure"]


def test_an_error_while_recording_does_not_hide_the_starts_own(launch_step, monkeypatch):
    step = launch_step()
    started_with(monkeypatch, RemoteError("docker run timed out", node="worker"))

    def broken(step, profile, outcome):
        raise AttributeError("'NoneType' object has no attribute 'checks'")
    monkeypatch.setattr(runbook.launch, "record", broken)
    with pytest.raises(RemoteError, match="docker run timed out") as raised:
        runbook.launch.run(step, action="start")
    assert any("recording what ran before it also failed: AttributeError" in n for n in raised.value.__notes__)


def test_run_returns_the_step_outcome_with_the_launch_shown(launch_step, monkeypatch):
    """``status``: nothing starts; the outcome shows the plan with its status, and carries the
    step's record and status."""
    step = launch_step()
    monkeypatch.setattr(runbook.launch.status, "status", lambda cluster, profile: {"head": "not running"})
    outcome = runbook.launch.run(step, action="status")
    assert isinstance(outcome, StepOutcome) and outcome.step == "04_launch" and outcome.status == "passed"
    assert outcome.shown.plan is PLAN and outcome.shown.status == {"head": "not running"}
    assert outcome.record == step.record and outcome.record.fingerprint == PLAN.fingerprint


def test_the_note_also_lands_where_add_note_is_missing():
    """Python 3.10 (``requires-python >=3.10``) has no ``add_note``: the note goes to ``__notes__`` all the same,
    and never raises in place of the start's error."""
    class Older:                     # an exception object of 3.10: no add_note
        pass
    err = Older()
    runbook.launch.note(err, "first")
    runbook.launch.note(err, "second")
    assert err.__notes__ == ["first", "second"]
    real = RemoteError("x")
    runbook.launch.note(real, "third")
    assert real.__notes__ == ["third"]
