"""The typed profile: one ``env/*.env`` file -> one validated :class:`Profile`; ``runbook.profile`` is the
entry every caller imports from.

``load_profile(path, overrides)`` reads the file and reports every problem together, at ``file:line``, as one
:class:`~runbook.errors.ProfileError` before anything connects to a node (``load.py``). The modules:

- ``types.py``  the value type of every key (ranges, grammars, friendly errors with a fix)
- ``model.py``  the :class:`Profile` (one field per key, in :data:`KEYS` order) and its derived values
- ``nodes.py``  :class:`NodeSpec`: the cluster's nodes in rank order (2 to 8), their keys, the topology
- ``load.py``   the file checks, the ``KEY=VALUE`` parse, unknown-key hints, :func:`load_profile`
- ``rules.py``  the cross-field rules; ``flags.py`` the ``vllm serve`` flags EXTRA_ARGS may not pass
- ``layouts.py`` which TP x PP the model splits into (its shape: the lab model's config.json, a table for the recipes)
"""
from __future__ import annotations

from ..envfile import EnvEntry
from .flags import MANAGED_FLAGS, REACH_FLAGS, RECIPE_MANAGED_FLAGS, flags_issue, managed_flags_in
from .load import (EXECUTING_KEYS, KNOWN_ENV_VARS, MAX_PROFILE_BYTES, OVERRIDE, SEED_ALIASES, ProfileWarning,
                   executing_keys_changed, is_secret_key, load_profile, parse_env_file, parse_env_text,
                   refuse_unservable)
from .model import KEYS, REPO_ROOT, REQUIRED_KEYS, Profile, round_up
from .nodes import (MAX_NODES, NODE_KEY_SUFFIXES, NODE_NAMES, TOPOLOGIES, NodeSpec, absent_node_keys, node_key,
                    node_keys, rank_gid_index)
from .types import KV_CACHE_DTYPES

__all__ = [
    "Profile", "NodeSpec", "rank_gid_index",
    "MAX_NODES", "NODE_NAMES", "NODE_KEY_SUFFIXES", "TOPOLOGIES", "absent_node_keys", "node_key", "node_keys", "ProfileWarning", "load_profile", "parse_env_file", "parse_env_text",
    "EXECUTING_KEYS", "executing_keys_changed", "refuse_unservable",
    "EnvEntry", "KEYS", "REQUIRED_KEYS", "KNOWN_ENV_VARS", "OVERRIDE", "REPO_ROOT",
    "is_secret_key", "round_up",
    # tables the tests check against vLLM and the seed recipes
    "KV_CACHE_DTYPES", "MANAGED_FLAGS", "REACH_FLAGS", "RECIPE_MANAGED_FLAGS", "flags_issue", "managed_flags_in",
    "MAX_PROFILE_BYTES", "SEED_ALIASES",
]
