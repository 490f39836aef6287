"""The four-Spark recipe profile (env/tp4-v41.env) mapped onto the four-node lab (env/lab-tp4.env, the switch):
each node's SSH target and fabric address become the lab node of the same rank, the port the recipe names is kept
(the lab's switch port is the same enp1s0f0np0), and every other key stays the recipe's."""
from __future__ import annotations

from runbook.lab.rehearsal import LAB_PROFILES, SET_BY_REHEARSAL, load_rehearsal, substitutions
from runbook.profile import KEYS, load_profile, node_key

RECIPE = "env/tp4-v41.env"


def test_every_node_lands_on_the_lab_node_of_its_rank():
    recipe, lab = load_profile(RECIPE), load_profile(LAB_PROFILES[4])
    assert recipe.node_count == lab.node_count == 4 and recipe.topology == lab.topology == "switch"
    by = {s.key: s for s in substitutions(recipe)}
    assert recipe.nodes
    for mine, theirs in zip(recipe.nodes, lab.nodes):
        assert mine.name == theirs.name
        assert by[node_key(mine.name, "SSH")].lab == theirs.ssh == f"spark-{mine.name}"
        assert by[node_key(mine.name, "IP")].recipe == mine.fabric_ip
        assert by[node_key(mine.name, "IP")].lab == theirs.fabric_ip
        assert node_key(mine.name, "CX7_IF") not in by            # enp1s0f0np0: the lab's switch port too
        assert by[node_key(mine.name, "IP")].goal == "node addresses"


def test_the_rehearsed_profile_runs_the_recipe_on_the_lab_switch():
    recipe = load_profile(RECIPE)
    rehearsed, overrides, subs = load_rehearsal(RECIPE)
    lab = load_profile(LAB_PROFILES[4])
    assert [n.fabric_ip for n in rehearsed.nodes] == [n.fabric_ip for n in lab.nodes]
    assert [n.fabric_if for n in rehearsed.nodes] == [n.fabric_if for n in recipe.nodes]
    assert rehearsed.topology == "switch" and (rehearsed.tp, rehearsed.nnodes) == (4, 4)
    listed = {s.key for s in subs} | set(SET_BY_REHEARSAL)
    kept = [k for k in KEYS if k not in listed]
    assert kept and {k: rehearsed.value(k) for k in kept} == {k: recipe.value(k) for k in kept}
    for key in ("RECIPE", "WEIGHT_SYNC", "ENGRAM", "PORT", "MASTER_PORT", "CONTAINER_HEAD", "HEAD_GID", "WORKER3_GID",
                "WORKER3_CX7_IB"):
        assert rehearsed.value(key) == recipe.value(key), key
