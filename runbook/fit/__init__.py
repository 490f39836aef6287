"""Fit planner: will this profile fit the nodes' memory and disks? (docs/fit.md)

Entry points:

* ``plan(profile, facts, checkpoint=None, origin="") -> Plan`` -- the pure model (``budget.py``);
* ``fit_checks(profile, gathered) -> list[Check]`` -- for preflight: ``gathered`` is
  ``runbook.preflight.gather``'s dict per node, each with ``gather_node(node, profile)`` under ``"fit"``;
* ``gather_node(node, profile)`` -- the read-only probes (df, df -i, du, boot id) for one node;
* ``python -m runbook plan --profile ...`` -- ``cli.py``.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..checks import Check
from .budget import DOES_NOT_FIT, FITS, UNKNOWN, FsFacts, NodeCapacity, Plan, Row, plan
from .facts import gather_node, node_facts_from_gather, nominal_facts, probe_paths
from .figures import Figure
from .render import plan_text

__all__ = ["DOES_NOT_FIT", "FITS", "UNKNOWN", "Figure", "FsFacts", "NodeCapacity", "Plan", "Row", "fit_checks", "fit_plan",
           "gather_node", "nominal_facts", "plan", "plan_text", "probe_paths"]


def fit_plan(profile, gathered: Mapping[str, Mapping[str, Any]], checkpoint: Figure | None = None) -> Plan:
    """The plan on facts preflight just measured. A node whose facts are missing or an Exception
    (``Cluster.each``) gets an N/A row and the verdict UNKNOWN."""
    return plan(profile, node_facts_from_gather(profile, gathered), checkpoint=checkpoint,
                origin="measured by preflight")


def fit_checks(profile, gathered: Mapping[str, Mapping[str, Any]], checkpoint: Figure | None = None) -> list[Check]:
    """One Check per plan row (name ``fit: ...``; FAIL rows carry the knob in ``fix`` and ``data.knob``)."""
    return fit_plan(profile, gathered, checkpoint).to_checks()
