"""The site a profile runs on, built by the lab: ``site_for(profile) -> runbook.site.Site``.

    site = site_for(load_profile("env/lab.env"))         # the lab: NFS and Engram stand-ins, its tiny model
    site = site_for(rehearsed)                             # a rehearsal: also the simulators of the hardware tools
    site_for(load_profile("env/exl3-v41.env")) is SPARKS_SITE

The one builder of sites: ``runbook.step.begin`` attaches its answer to every step (``step.site``), and the
runner, the offline review and the CLI call it too, so a step never imports the lab (docs/DESIGN.md, "The site").
"""
from __future__ import annotations

from ..site import LAB, REHEARSAL, SPARKS_SITE, Site
from . import control, engram_source, nfs, sim


def site_for(profile) -> Site:
    """The Sparks (:data:`SPARKS_SITE`) unless the profile is the lab's (RECIPE=lab) or a recipe rehearsed on it
    (REHEARSAL=1). Each field follows what the profile says it runs on:

    * a rehearsal: the simulators of the hardware-only tools (``sim``: installed first, their GID tables, the
      nccl-tests simulator, their bin dir left off PATH where a real tool is looked for);
    * RECIPE=lab or a rehearsal: the userspace NFS server and sshfs mount for the kernel's (``nfs.share``);
    * RECIPE=lab: the synthetic Engram source 03 generates (``engram_source.prepare_lab_source``);
    * LAB=1 (the lab's hardware, also under a rehearsed recipe): the local tiny model and the lab's vLLM venv.
    """
    rehearsal, own = bool(profile.rehearsal), bool(profile.is_lab)
    if not (rehearsal or own or profile.lab):
        return SPARKS_SITE
    fields = {}
    if rehearsal:
        fields.update(simulated=True, install_simulators=sim.install, sysfs=sim.SYSFS_ROOT,
                      simulator_bin=f"{sim.SIM_DIR}/bin", nccl_tests_dir=sim.NCCL_TESTS_DIR)
    if rehearsal or own:
        fields["nfs_stand_in"] = nfs.share
    if own:
        fields["engram_source"] = engram_source.prepare_lab_source
    if profile.lab:
        fields.update(model_dir=control.stand_in_model_dir, vllm_python=str(control.VLLM_PYTHON))
    return Site(name=REHEARSAL if rehearsal else LAB, **fields)
