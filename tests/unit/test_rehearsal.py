"""Rehearsal mapping: a recipe profile on the lab keeps every key but the hardware-bound ones, each listed."""
from __future__ import annotations

import pytest

from runbook.errors import ProfileError
from runbook.lab.rehearsal import (GROUP_CLASS, GROUPS, HARDWARE, LAB_CLASS, SET_BY_REHEARSAL,
                                   count, load_rehearsal, substitutions)
from runbook.profile import KEYS, load_profile

RECIPES = ["env/exl3-v41.env", "env/dspark-v4.env", "env/tp3-dspark.env", "env/tp4-v41.env"]
SUBSTITUTABLE = {k for _, keys in GROUPS.values() for k in keys}


@pytest.mark.parametrize("path", RECIPES)
def test_rehearsal_keeps_every_key_it_does_not_list(path):
    recipe = load_profile(path)
    rehearsed, overrides, subs = load_rehearsal(path)
    assert subs, "a rehearsal substitutes at least the nodes"
    listed = {s.key for s in subs}
    assert set(overrides) == listed | set(SET_BY_REHEARSAL)         # the run's mode is set, not substituted
    assert listed <= SUBSTITUTABLE, listed - SUBSTITUTABLE
    kept = [k for k in KEYS if k not in listed | set(SET_BY_REHEARSAL)]
    assert kept
    assert {k: rehearsed.value(k) for k in kept} == {k: recipe.value(k) for k in kept}
    assert rehearsed.recipe == recipe.recipe and rehearsed.rehearsal and rehearsed.lab
    # what the issue says a rehearsal must keep exactly
    for key in ("WEIGHTS_DIR", "WEIGHT_SYNC", "RUNTIME", "PORT", "MASTER_PORT", "HF_MODEL_REPO", "HF_REVISION",
                "ENGRAM", "ENGRAM_SRC_DIR", "ENGRAM_PACKED_DIR", "CACHE_DIR", "EXPECT_GPU", "EXPECT_RDMA"):
        assert rehearsed.value(key) == recipe.value(key), key
    assert len(rehearsed.nodes) == len(recipe.nodes)
    assert all(n.ssh.startswith("spark-") for n in rehearsed.nodes)


def test_every_substitution_says_why_and_what_it_replaced():
    subs = substitutions(load_profile("env/exl3-v41.env"))
    by_key = {s.key: s for s in subs}
    assert by_key["HEAD_SSH"].recipe == "spark1" and by_key["HEAD_SSH"].lab == "spark-head"
    assert by_key["QUANTIZATION"].group == "gpu" and "CPU build" in by_key["QUANTIZATION"].why
    assert all(s.why for s in subs)


def test_a_lab_profile_is_not_rehearsed():
    with pytest.raises(ProfileError) as err:
        load_rehearsal("env/lab.env")
    assert "RECIPE" in str(err.value)


def test_user_overrides_of_substituted_keys_are_refused_by_name():
    with pytest.raises(ProfileError) as err:
        load_rehearsal("env/exl3-v41.env", {"HEAD_IP": "10.0.0.9"})
    assert "HEAD_IP" in str(err.value) and "--rehearse" in str(err.value)


def test_rehearsal_key_in_a_profile_file_without_the_lab_is_rejected(tmp_path):
    text = open("env/exl3-v41.env").read().replace("REHEARSAL=0", "REHEARSAL=1")
    bad = tmp_path / "bad.env"
    bad.write_text(text)
    with pytest.raises(ProfileError) as err:
        load_profile(bad)
    assert "REHEARSAL" in str(err.value)


def test_lab_home_shares_only_the_python_installs_under_the_home(tmp_path):
    """The lab nodes' homes are private; the host home's entries the lab venvs' interpreters live in are the
    only ones bound back (read-only). A venv whose interpreter lies outside the home adds nothing."""
    from runbook.lab.netlab.nodes import home_shares
    home = tmp_path / "root"
    (home / ".pyenv" / "versions" / "3.11.7" / "bin").mkdir(parents=True)
    lab = tmp_path / "repo" / ".lab"
    (lab / "vllm-venv").mkdir(parents=True)
    (lab / "vllm-venv" / "pyvenv.cfg").write_text(f"home = {home}/.pyenv/versions/3.11.7/bin\n"
                                                  "include-system-site-packages = false\n")
    (tmp_path / "repo" / ".venv").mkdir()
    (tmp_path / "repo" / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    shares = home_shares(lab, home=home)
    assert shares == [".pyenv"]                     # sys.base_prefix lies outside this made-up home
    assert home_shares(tmp_path / "nothing" / ".lab", home=home) == []


@pytest.mark.parametrize("path", RECIPES)
def test_every_substitution_has_a_class_and_the_classes_add_up(path):
    subs = substitutions(load_profile(path))
    classes = count([s.to_dict() for s in subs])["classes"]
    assert set(classes) == {HARDWARE, LAB_CLASS} and all(classes.values())
    assert sum(classes.values()) == len(subs) > 0
    assert {s.to_dict()["kind"] for s in subs} <= {HARDWARE, LAB_CLASS}
    # the GPU-only serving keys are forced by the hardware; where the nodes are and who runs them is not
    kinds = {s.key: s.kind for s in subs}
    gpu_keys = [s.key for s in subs if s.group == "gpu"]
    assert gpu_keys and {kinds[k] for k in gpu_keys} == {HARDWARE}
    assert kinds["HEAD_SSH"] == LAB_CLASS and kinds["HEAD_IP"] == LAB_CLASS
    assert not {"LAB", "REHEARSAL", "LAB_NODES", "LAB_CPU_BIND"} & set(kinds)


def test_every_group_has_a_class():
    assert set(GROUPS) | {"model"} == set(GROUP_CLASS)


def test_a_live_node_that_fails_ssh_is_named_and_a_dead_one_is_not():
    from runbook.lab.netlab.health import unreachable_live_nodes
    status = {"nodes": {
        "head": {"sshd_alive": True, "ssh_ok": True},
        "worker": {"sshd_alive": True, "ssh_ok": False, "ssh_error": "Host key verification failed."},
        "worker2": {"sshd_alive": False, "ssh_ok": False, "ssh_error": "Connection refused"},
    }}
    assert unreachable_live_nodes(status) == {"worker": "Host key verification failed."}
    assert unreachable_live_nodes({"nodes": {"head": {"sshd_alive": True, "ssh_ok": True}}}) == {}
