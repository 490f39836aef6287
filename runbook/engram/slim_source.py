"""Recipe A's slim Engram source: ``slim.py`` run on every packing node into ``CACHE_DIR/engram-src``
(what 04_launch mounts at ``/engram-src``), and its ``engram slim source`` row.
"""
from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from ..checks import Check, check, not_applicable
from ..engram_tools.ship import (DEFAULT_TOOLS_DIR, is_dry, last_json, node_facts, shell_path, ship_tools, src_of,
                    tail_line)

SLIM_SUBDIR = "engram-src"      # under CACHE_DIR: what recipe A's launch mounts at /engram-src


def make_slim_source(cluster, profile, facts: Mapping[str, Any] | None = None, *,
                     tools_dir: str = DEFAULT_TOOLS_DIR) -> list[Check]:
    """Recipe A only: on every node that packs, the slim Engram dir (``slim.py``: Engram shards hard-linked,
    config, an Engram-only index) in ``CACHE_DIR/engram-src``, which 04 mounts at ``/engram-src``."""
    if profile.recipe != "exl3-v41" or not profile.engram:
        return [not_applicable("engram slim source", f"RECIPE={profile.recipe}: only recipe A mounts it",
                               node="cluster")]
    out: list[Check] = []
    for spec in profile.nodes:
        if not profile.holds_rank(spec.rank):
            continue
        node = cluster[spec.name]
        nf = node_facts(facts, node.name)
        tdir = ship_tools(node, tools_dir)
        dst = f"{profile.cache_dir.rstrip('/')}/{SLIM_SUBDIR}"
        cmd = " ".join([str(nf.get("python", "python3")), shlex.quote(f"{tdir}/slim.py"),
                        "--src", shell_path(src_of(profile, nf)), "--dst", shell_path(dst)]
                       + (["--symlink"] if profile.engram_source_shared_on(node.name) else []))
        res = node.run(cmd, timeout=600, warn=True)
        if is_dry(node, res):
            out.append(not_applicable("engram slim source", "dry run", node=node.name))
            continue
        summary = last_json(res.stdout)
        out.append(check("engram slim source", bool(summary.get("ok")), node=node.name,
                         observed=(f"{summary.get('tables')} tables in {', '.join(summary.get('shards', []))} "
                                   f"-> {summary.get('dst')} ({summary.get('files')})") if summary.get("ok")
                         else str(summary.get("error") or tail_line(res.stderr) or f"exit {res.exit_code}"),
                         expected="an Engram-only index, the Engram shards and config.json in CACHE_DIR/engram-src",
                         fix="rerun 02_weights (it downloads the Engram source), then this step",
                         data={"slim": summary}))
    return out
