"""Preflight's "no stale vLLM ranks" on what the launch removes itself: a stopped container of the profile's own
name (left when the lab was reshaped for a three-node rehearsal) is a NO-OP row, a running one is still a FAIL;
and on lab hardware the kernel CMA pool row is N/A (no RDMA device registers memory there)."""
from __future__ import annotations

from runbook.checks import Status
from runbook.facts.ranks import RankState
from runbook.preflight import verify
from support.profiles import profile_from


def _facts(*containers: str) -> dict:
    return {"rank": RankState(node="head"), "containers": list(containers), "vllm_procs": []}


def test_a_stopped_container_of_the_profiles_own_name_is_for_the_launch_to_remove():
    profile = profile_from("env/dspark-v4.env")
    name = profile.container_head
    row = verify._stale("head", _facts(f"{name}\tExited (0) 15 minutes ago\timg:1"), profile)
    assert row.status is Status.NOOP and "Exited (0)" in row.observed and "removes" in row.expected
    created = verify._stale("head", _facts(f"{name}\tCreated\timg:1"), profile)
    assert created.status is Status.NOOP


def test_a_running_container_of_the_profiles_own_name_is_still_stale():
    profile = profile_from("env/dspark-v4.env")
    row = verify._stale("head", _facts(f"{profile.container_head}\tUp 3 minutes\timg:1"), profile)
    assert row.status is Status.FAIL and "Up 3 minutes" in row.observed


def test_a_foreign_container_is_not_ours_to_judge():
    profile = profile_from("env/dspark-v4.env")
    row = verify._stale("head", _facts("someone-elses\tExited (1) 2 days ago\tx:1"), profile)
    assert row.status is Status.PASS


def test_the_cma_row_is_not_applicable_on_lab_hardware_even_when_the_recipe_expects_rdma():
    profile = profile_from("env/dspark-v4.env", LAB=1, REHEARSAL=1)
    assert profile.expect_rdma and profile.lab
    rows = verify.residue_checks("head", {"mem": {"MemTotal": 1024}, "residue": {}}, profile)
    cma = next(r for r in rows if r.name == "kernel CMA pool")
    assert cma.status is Status.NA and "lab hardware" in cma.observed
