"""Real profiles for tests: a shipped ``env/*.env`` with ``KEY=value`` overrides, validated like
``python -m runbook ... -p KEY=VALUE`` (the same loader, model and cross-field rules), so a test can only
build a profile a user could.

    profile = profile_from("env/lab.env", EXPECT_RDMA=1, MIN_TCP_GBPS=0.1)
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from runbook.profile import Profile, load_profile

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["ROOT", "profile_from"]


def _text(value: Any) -> str:
    """An override as the command line would spell it: booleans 1/0, lists comma-separated."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def profile_from(path: str = "env/lab.env", **keys: Any) -> Profile:
    """``path`` (repo-relative or absolute) loaded with ``keys`` (upper-case profile keys) as overrides;
    a bad key or value raises the loader's ``ProfileError``, as on the command line."""
    src = Path(path)
    return load_profile(src if src.is_absolute() else ROOT / src, overrides={k: _text(v) for k, v in keys.items()})
