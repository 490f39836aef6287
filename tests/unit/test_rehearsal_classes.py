"""Issue #23 item 6, "count what is substituted": every substitution of a rehearsal has a class (hardware, lab),
every *lab* one a goal group (node addresses, Hub endpoint and model, registry host, recipe repository), one
function counts them (rehearsal.json, the CLI's line, the report), and the run's mode is recorded, not counted."""
from __future__ import annotations

import itertools
import json

import pytest

from runbook.errors import ProfileError
from runbook.lab import rehearsal
from runbook.lab.netlab.spec import OPERATOR
from runbook.site import GOALS, count_text
from runbook.lab.rehearsal import (HARDWARE, LAB_CLASS, NO_GOAL, SET_BY_REHEARSAL, Substitution, count,
                                   image_substitutions, load_rehearsal, model_substitutions,
                                   substitutions)
from runbook.launch.render import NodeFacts, render
from runbook.profile import load_profile

RECIPES = ["env/exl3-v41.env", "env/dspark-v4.env", "env/tp3-dspark.env", "env/tp4-v41.env"]
LAB_DIGEST = "sha256:" + "1" * 64

def every_substitution(path: str, ssh_user: str = "") -> list[Substitution]:
    """What a real rehearsal records: the mapping, plus what publishing adds (the stand-ins' Hub revisions and a
    pinned image's digest; the lab's commits and digest made up here, as they are known only once published)."""
    profile = load_profile(path)
    subs = substitutions(profile, ssh_user=ssh_user)
    subs += model_substitutions(profile, "a" * 40, "b" * 40)
    subs += [s for s in image_substitutions(profile, LAB_DIGEST) if s.part == "digest"]
    return subs


@pytest.mark.parametrize("path,ssh_user", list(itertools.product(RECIPES, ("", OPERATOR))))
def test_every_lab_substitution_falls_in_a_goal_group(path, ssh_user):
    subs = every_substitution(path, ssh_user)
    lab = [s for s in subs if s.kind == LAB_CLASS]
    assert lab and len(lab) < len(subs)
    offenders = [(s.key, s.part, s.group, s.lab) for s in lab if s.goal not in GOALS]
    assert not offenders, f"lab-class substitutions outside #23's goal groups {GOALS}: {offenders}"
    # the lab's nodes carry the Sparks' port names (#23 item 5): no interface key is substituted
    assert not [s.key for s in subs if s.key.endswith("_CX7_IF") or s.key == "BOOTSTRAP_IF"]
    assert {s.goal for s in subs if s.kind == HARDWARE} == {""}          # the goal is the lab class's only
    # what the goal names is all there: the nodes, the Hub and the model, the image's registry host, the recipe
    goals = {s.key: s.goal for s in lab}
    assert {goals[k] for k in ("HEAD_SSH", "HEAD_IP", "HF_ENDPOINT", "HF_REVISION", "IMAGE", "RECIPE_REPO")} == set(GOALS)


@pytest.mark.parametrize("path", RECIPES)
def test_the_lab_class_is_no_more_than_the_goal(path):
    outside = [s.key for s in every_substitution(path) if s.kind == LAB_CLASS and s.goal == NO_GOAL]
    assert outside == []


def test_what_the_goal_cannot_keep_on_the_lab_says_so():
    """The recipe's pinned commit and a pinned image digest are content-addressed: the lab cannot have them, and
    their rows say that this part of the goal cannot be met there (not a silent substitution)."""
    subs = {(s.key, s.part): s for s in every_substitution("env/dspark-v4.env")}
    commit, digest = subs[("RECIPE_COMMIT", "")], subs[("IMAGE", "digest")]
    assert commit.goal == rehearsal.RECIPE_REPOSITORY and digest.goal == rehearsal.REGISTRY_HOST
    for sub in (commit, digest):
        assert "content-addressed" in sub.why and "cannot be met on the lab" in sub.why, sub.why
    assert "not reachable" in commit.why
    # the SSH files: the site's own (empty in every recipe profile), grouped with the node addresses, said why
    for key in ("SSH_CONFIG", "SSH_KEY", "KNOWN_HOSTS"):
        sub = subs[(key, "")]
        assert sub.recipe == "" and sub.goal == rehearsal.NODE_ADDRESSES
        assert "reaches the site's nodes" in sub.why and "node addresses" in sub.why


@pytest.mark.parametrize("path", RECIPES)
def test_the_runs_mode_is_set_but_not_substituted(path):
    profile, overrides, subs = load_rehearsal(path)
    assert profile.lab and profile.rehearsal
    assert {k: overrides[k] for k in SET_BY_REHEARSAL} == {"LAB": "1", "REHEARSAL": "1"}
    assert not set(SET_BY_REHEARSAL) & {s.key for s in subs}
    with pytest.raises(ProfileError) as err:
        load_rehearsal(path, {"REHEARSAL": "0"})
    assert "REHEARSAL" in str(err.value) and "the run's mode" in str(err.value)


@pytest.mark.parametrize("path", RECIPES)
def test_lab_nodes_and_cpu_binding_are_not_substituted(path):
    """The lab has as many nodes as the profile names, and derives the CPU binding the recipe leaves empty."""
    recipe = load_profile(path)
    rehearsed, _, subs = load_rehearsal(path)
    assert not {"LAB_NODES", "LAB_CPU_BIND"} & {s.key for s in subs}
    assert rehearsed.lab_cpu_bind == recipe.lab_cpu_bind == "" and len(rehearsed.nodes) == len(recipe.nodes)


def test_the_cpu_binding_is_derived_from_the_hosts_cpus(monkeypatch):
    """Empty LAB_CPU_BIND: the head alone on CPU 0, the other ranks in turn on the others — the rank number while
    there are CPUs enough, 0,1,1 for three ranks on this 2-core machine (what env/lab-tp3.env pins)."""
    p = load_profile("env/tp3-dspark.env")
    assert [[p.cpu_bind(r, cpus=n) for r in range(3)] for n in (1, 2, 3, 16)] == [
        ["0", "0", "0"], ["0", "1", "1"], ["0", "1", "2"], ["0", "1", "2"]]
    rehearsed, _, _ = load_rehearsal("env/tp3-dspark.env")
    facts = {n.name: NodeFacts(home="/root") for n in rehearsed.nodes}
    for cpus, want in (({0, 1}, ["0", "1", "1"]), (set(range(8)), ["0", "1", "2"])):
        monkeypatch.setattr("os.sched_getaffinity", lambda pid, cpus=cpus: cpus)
        plan = render(rehearsed, facts)
        assert [plan.rank(n.name).env["VLLM_CPU_OMP_THREADS_BIND"] for n in rehearsed.nodes] == want


def test_one_count_for_every_reader():
    records = [s.to_dict() for s in every_substitution("env/exl3-v41.env")]
    counts = count(records)
    assert list(counts["classes"]) == [HARDWARE, LAB_CLASS]
    assert sum(counts["classes"].values()) == len(records) > 0
    assert list(counts["lab_by_goal"]) == [*GOALS, NO_GOAL]
    assert sum(counts["lab_by_goal"].values()) == counts["classes"][LAB_CLASS]
    assert counts["lab_by_goal"][rehearsal.NODE_ADDRESSES] == 7       # 2 SSH targets, 3 SSH files, 2 fabric addresses
    assert counts["lab_by_goal"][rehearsal.HUB] == 3                  # endpoint, model and Engram revisions
    assert counts["lab_by_goal"][NO_GOAL] == 0                        # the port names are kept (#23 item 5)
    # a record of an older run: no class or no goal is counted as such, never dropped
    old = count([{"key": "X"}, {"key": "Y", "kind": "lab"}])
    assert old == {"classes": {HARDWARE: 0, LAB_CLASS: 1, "unclassified": 1},
                   "lab_by_goal": {**dict.fromkeys(GOALS, 0), NO_GOAL: 1}}
    text = count_text(counts)
    assert text.startswith(f"hardware: {counts['classes'][HARDWARE]}, lab: {counts['classes'][LAB_CLASS]} (node addresses: 7, ")
    assert text.endswith(", none: 0)")


def test_rehearsal_json_records_the_mode_and_the_counts():
    profile, _, subs = load_rehearsal("env/dspark-v4.env")
    records = [s.to_dict() for s in subs]
    rec = json.loads(json.dumps(rehearsal.record(profile, records)))
    assert rec["mode"]["keys"] == {"LAB": "1", "REHEARSAL": "1"} and "run --rehearse" in rec["mode"]["why"]
    assert rec["substituted"] == records and all(r["goal"] for r in records if r["kind"] == LAB_CLASS)
    assert (rec["classes"], rec["lab_by_goal"]) == (count(records)["classes"], count(records)["lab_by_goal"])
    assert set(rec["tools"]) == {"simulated", "real"} and rec["profile"].endswith("dspark-v4.env")
