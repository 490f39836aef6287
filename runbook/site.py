"""The site: what differs between the real Sparks, the embedded lab and a rehearsal of a recipe on the lab.

    step.site.install_simulators(cluster, profile)     # [] on the Sparks; a rehearsal's simulated Spark
    sysfs = step.site.sysfs                             # where the RoCE GID tables are read

A step asks its :class:`Site` (``step.site``, attached by ``runbook.step.begin``) for everything that is not the
same on every site -- the simulators of the hardware-only tools, where their files are, the lab's stand-ins for
the kernel NFS server and for the Engram download, the lab's tiny model and vLLM venv -- and never imports
``runbook.lab`` (``tests/unit/test_layers.py``'s ``step_to_lab`` rule). The lab builds its sites
(``runbook.lab.site.site_for(profile)``); :data:`SPARKS_SITE` is the real hardware: no stand-in, no simulator.

Also here, because the report reads it from any recorded run whatever site renders it: the one count of a
rehearsal's substituted keys (:func:`count`, :func:`count_text`), by class and goal group.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checks import Check
from .facts.rdma import SYSFS

SPARKS, LAB, REHEARSAL = "sparks", "lab", "rehearsal"


def no_simulators(cluster: Any, profile: Any) -> list[Check]:
    """The Sparks run the real tools: nothing to install."""
    return []


@dataclass(frozen=True)
class Site:
    """One site's differences, as values and callables (built by ``runbook.lab.site.site_for``; the Sparks':
    :data:`SPARKS_SITE`). Every field's default is the real hardware's."""
    name: str = SPARKS
    # -- the hardware-only tools (nvidia-smi, ibdev2netdev, ibv_devinfo, perftest, nccl-tests)
    #: the hardware-only tools are simulators (a rehearsal): their passing rows say SIMULATED, with the row's reason
    simulated: bool = False
    #: put the simulators on every node before any GPU/RDMA fact is read (their rows); the Sparks: none
    install_simulators: Callable[[Any, Any], list[Check]] = no_simulators
    #: the root under which the RoCE GID tables are read (``<sysfs>/class/infiniband/…``)
    sysfs: str = SYSFS
    #: the simulators' bin directory on a node, left off PATH where a real tool is looked for ("" = none)
    simulator_bin: str = ""
    #: where nccl-tests' ``all_reduce_perf`` is ("" = looked for as on a Spark)
    nccl_tests_dir: str = ""
    # -- the lab's stand-ins for what its kernel and its network cannot run
    #: the kernel NFS server and the worker's kernel mount, where nfsd and the NFS client cannot run:
    #: ``(head, worker, export_dir, mountpoint, *, head_manifest, name, tree, probe, worker_ips, parity)
    #: -> (checks, data)``; None where the kernel's run (the Sparks)
    nfs_stand_in: Callable[..., tuple[list[Check], dict[str, Any]]] | None = None
    #: the Engram source generated in place of 02_weights' download (``lab fixture: …`` rows):
    #: ``(cluster, profile) -> checks``; None where the source is downloaded (a recipe, rehearsed or not)
    engram_source: Callable[[Any, Any], list[Check]] | None = None
    #: the local copy of the model the site serves (its tokenizer, its safetensors headers): ``profile -> dir``;
    #: None where the checkpoint is read on the head (the Sparks)
    model_dir: Callable[[Any], Path] | None = None
    #: a python with vLLM on this machine for ``vllm bench serve`` ("" = the one the caller names, or found)
    vllm_python: str = ""

    @property
    def on_lab(self) -> bool:
        """The nodes are the lab's network namespaces (the lab profile, or a recipe rehearsed there)."""
        return self.name != SPARKS


#: the real DGX Sparks: the real tools, the kernel's NFS, the downloaded Engram source, the checkpoint on the head
SPARKS_SITE = Site()


# -- the one count of a rehearsal's substitutions (rehearsal.json; the CLI, the runner and the report) --------------

# Two classes of substitution (issue "rehearsal substitutes less"): *hardware* is what the lab cannot have (a GPU,
# the CX-7/RDMA link, the GPU-only serving flags and the sizes that follow from GPU memory and the tiny model that
# stands in for a model no CPU can serve); *lab* is everything else the lab still changes. A rehearsal is worth as
# much as its *lab* class is small: each *lab* key is a place where the rehearsal does not run what the Sparks run.
HARDWARE, LAB_CLASS = "hardware", "lab"

# The goal of issue #23 item 6: a *lab* substitution is one of these four, everything else runs as written. A *lab*
# key without a goal group ("none") is a place where a rehearsal changes the recipe although it need not.
NODE_ADDRESSES, HUB, REGISTRY_HOST, RECIPE_REPOSITORY, NO_GOAL = (
    "node addresses", "Hub endpoint and model", "registry host", "recipe repository", "none")
GOALS = (NODE_ADDRESSES, HUB, REGISTRY_HOST, RECIPE_REPOSITORY)


def count(records: list[dict]) -> dict[str, dict[str, int]]:
    """The one count of a rehearsal's substitutions (``Substitution.to_dict`` records, as rehearsal.json holds
    them; the CLI, the runner and the report all call this): ``classes`` (hardware, lab; a record of an older run
    without a class counts as "unclassified") and ``lab_by_goal`` (the lab class by :data:`GOALS`, then
    :data:`NO_GOAL`; every group present, 0 where empty).

    >>> count([{"kind": "hardware"}, {"kind": "lab", "goal": "registry host"}, {"kind": "lab"}])["lab_by_goal"]
    {'node addresses': 0, 'Hub endpoint and model': 0, 'registry host': 1, 'recipe repository': 0, 'none': 1}
    """
    classes = {HARDWARE: 0, LAB_CLASS: 0}
    goals = dict.fromkeys((*GOALS, NO_GOAL), 0)
    for rec in records:
        kind = str(rec.get("kind") or "unclassified")
        classes[kind] = classes.get(kind, 0) + 1
        if kind == LAB_CLASS:
            goal = str(rec.get("goal") or NO_GOAL)
            goals[goal] = goals.get(goal, 0) + 1
    return {"classes": classes, "lab_by_goal": goals}


def count_text(counts: dict[str, dict[str, int]]) -> str:
    """:func:`count`'s answer in one line, e.g. ``hardware: 33, lab: 10 (node addresses: 7, …, none: 0)``."""
    classes = ", ".join(f"{kind}: {n}" for kind, n in counts["classes"].items())
    goals = ", ".join(f"{goal}: {n}" for goal, n in counts["lab_by_goal"].items())
    return f"{classes} ({goals})"
