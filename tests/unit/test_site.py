"""The site (runbook/site.py, built by runbook/lab/site.py): the Sparks get no stand-in and no simulator, the lab and
a rehearsal get exactly theirs, and ``step.begin`` attaches the builder's answer so a step reads ``step.site``."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from runbook.checks import check
from runbook.facts import rdma as fr
from runbook.lab import control, engram_source, nfs, sim
from runbook.lab.site import site_for
from runbook.profile import load_profile
from runbook.site import LAB, REHEARSAL, SPARKS, SPARKS_SITE, Site

ROOT = Path(__file__).resolve().parents[2]
ENV = ROOT / "env"


def _rehearsed(name: str = "exl3-v41"):
    """A recipe profile as `run --rehearse` sets its mode (LAB=1, REHEARSAL=1); the substitutions do not matter here."""
    return load_profile(ENV / f"{name}.env").model_copy(update={"lab": True, "rehearsal": True})


def test_every_recipe_profile_runs_on_the_sparks_site():
    shipped = [load_profile(p) for p in sorted(ENV.glob("*.env"))]
    recipes = [p for p in shipped if not (p.is_lab or p.lab or p.rehearsal)]
    assert len(recipes) >= 3, [p.profile_name for p in shipped]
    for profile in recipes:
        site = site_for(profile)
        assert site is SPARKS_SITE, profile.profile_name
    assert (SPARKS_SITE.name, SPARKS_SITE.on_lab, SPARKS_SITE.simulated) == (SPARKS, False, False)
    assert SPARKS_SITE.install_simulators(None, None) == [] and SPARKS_SITE.sysfs == fr.SYSFS
    assert (SPARKS_SITE.nfs_stand_in, SPARKS_SITE.engram_source, SPARKS_SITE.model_dir) == (None, None, None)
    assert (SPARKS_SITE.simulator_bin, SPARKS_SITE.nccl_tests_dir, SPARKS_SITE.vllm_python) == ("", "", "")


@pytest.mark.parametrize("name", ["lab", "lab-tp3", "lab-tp4"])
def test_the_lab_site_has_the_lab_stand_ins_and_no_simulator(name):
    profile = load_profile(ENV / f"{name}.env")
    site = site_for(profile)
    assert (site.name, site.on_lab, site.simulated) == (LAB, True, False)
    assert site.nfs_stand_in is nfs.share and site.engram_source is engram_source.prepare_lab_source
    assert site.model_dir is control.stand_in_model_dir and site.vllm_python == str(control.VLLM_PYTHON)
    assert site.install_simulators(None, profile) == [] and site.sysfs == fr.SYSFS and site.nccl_tests_dir == ""


@pytest.mark.parametrize("name", ["exl3-v41", "dspark-v4", "tp3-dspark"])
def test_a_rehearsal_site_has_the_simulators_and_the_nfs_stand_in_but_downloads_its_engram_source(name):
    site = site_for(_rehearsed(name))
    assert (site.name, site.on_lab, site.simulated) == (REHEARSAL, True, True)
    assert site.install_simulators is sim.install and site.sysfs == sim.SYSFS_ROOT
    assert site.simulator_bin == f"{sim.SIM_DIR}/bin" and site.nccl_tests_dir == sim.NCCL_TESTS_DIR
    assert site.nfs_stand_in is nfs.share and site.model_dir is control.stand_in_model_dir
    assert site.engram_source is None          # a rehearsal downloads the recipe's source from the lab's Hub (02)


def test_a_site_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SPARKS_SITE.simulated = True        # type: ignore[misc]


def test_begin_attaches_the_builders_site(tmp_path):
    import runbook.step
    lab = runbook.step.begin("00_preflight", ENV / "lab.env", results_root=tmp_path)
    assert lab.site == site_for(lab.profile) and lab.site.name == LAB
    spark = runbook.step.begin("00_preflight", ENV / "exl3-v41.env", results_root=tmp_path)
    assert spark.site is SPARKS_SITE
    with pytest.raises(TypeError, match="site"):          # no step without a site: never a silent default
        runbook.step.Step("00_preflight", spark.profile, spark.run)


def test_a_step_installs_its_sites_simulators_and_passes_the_site_down(monkeypatch):
    """01's run asks its site, not the profile: a site's simulator rows land in the step, and the site reaches the
    verification (the same Sparks profile, two sites)."""
    import runbook.network as step01
    seen = []

    def fake_verify(profile, cluster, **kw):
        seen.append(kw["site"])
        raise RuntimeError("stop after the call")

    monkeypatch.setattr(step01, "verify_network", fake_verify)
    profile = load_profile(ENV / "exl3-v41.env")
    row = check("sim installed", True, node="head")
    site = Site(name=REHEARSAL, simulated=True, install_simulators=lambda cluster, prof: [row])
    for given, rows in ((SPARKS_SITE, []), (site, [row])):
        added = []
        step = SimpleNamespace(profile=profile, cluster=None, site=given, add=added.extend)
        with pytest.raises(RuntimeError, match="stop after the call"):
            step01.run(step)
        assert added == rows and seen[-1] is given
