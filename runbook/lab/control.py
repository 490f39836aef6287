"""Glue between a profile and the lab: bring the lab up when the profile targets it."""
from __future__ import annotations

from ..evidence import REPO_ROOT


def ensure_lab(profile):
    """Bring the lab up (idempotent) with as many nodes as the profile names."""
    from . import netlab
    return netlab.up(REPO_ROOT / ".lab", nodes=len(profile.nodes))
