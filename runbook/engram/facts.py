"""Read-only facts of step ``03_engram``: what each node has (python3, the Engram source as it sees
``ENGRAM_SRC_DIR``, free space and the packed files and progress records already there), and the pure
parsers of those listings.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..engram_tools import layout as L
from ..engram_tools.pack_partial import RECORD_BYTES
from ..engram_tools.ship import node_facts, packed_of, parse_stat_lines, shell_path, src_of


def gather_facts(cluster, profile, facts: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Read-only, every node in parallel: python3 version, the source files (config.json, index,
    sizes) as this node sees ENGRAM_SRC_DIR, free bytes where the packed dir is (or would be), and
    packed files already there. ``facts`` (per-node overrides) are carried over."""
    def probe(node):
        nf: dict[str, Any] = dict(node_facts(facts, node.name))
        nf["rank"] = node.spec.rank
        py = str(nf.get("python", "python3"))
        res = node.read(f"{py} -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'", timeout=20)
        nf["python_version"] = res.stdout.strip() if res.ok else ""
        try:
            nf["python_ok"] = tuple(int(x) for x in nf["python_version"].split(".")) >= (3, 8)
        except ValueError:
            nf["python_ok"] = False
        src = src_of(profile, nf)
        nf["src_dir"] = src
        res = node.read(f"cd {shell_path(src)} 2>/dev/null && stat -c '%s %n' -- * 2>/dev/null", timeout=20)
        nf["src_files"] = parse_stat_lines(res.stdout) if res.ok else {}
        for key, fname in (("config", "config.json"), ("index", L.INDEX_NAME)):
            if fname in nf["src_files"]:
                res = node.read(f"cat {shell_path(src.rstrip('/') + '/' + fname)}", timeout=20)
                try:
                    nf[key] = json.loads(res.stdout) if res.ok else None
                except ValueError:
                    nf[key] = None
                    nf[f"{key}_error"] = f"{fname} is not valid JSON"
        packed = packed_of(profile, nf)
        res = node.read(f"p={shell_path(packed)}; while [ ! -d \"$p\" ] && [ \"$p\" != / ]; do p=$(dirname \"$p\"); "
                        f"done; df -B1 --output=avail,target \"$p\" | tail -n 1", timeout=20)
        parts = res.stdout.split()
        if res.ok and parts and parts[0].isdigit():
            nf["packed_free_bytes"] = int(parts[0])
            nf["packed_fs"] = parts[1] if len(parts) > 1 else ""
        res = node.read(f"cd {shell_path(packed)} 2>/dev/null && stat -c '%s %n' -- engram-l*-r*of*.bin* "
                        f"2>/dev/null", timeout=20)
        nf["packed_existing"] = parse_stat_lines(res.stdout)
        if any(n.endswith(".partial.json") for n in nf["packed_existing"]):
            res = node.read(f"cd {shell_path(packed)} && for f in engram-l*-r*of*.bin.partial.json; do "
                            f"printf '%s ' \"$f\"; head -c {RECORD_BYTES} \"$f\" | tr -d '\\n'; echo; done",
                            timeout=20)
            nf["packed_records"] = parse_records(res.stdout)
        return nf
    ranks = {n.name: n.spec.rank for n in cluster.nodes}
    return {name: (value if not isinstance(value, Exception) else
                   {"error": str(value).splitlines()[0], "rank": ranks.get(name, 99)})
            for name, value in cluster.each(probe).items()}


def parse_records(text: str) -> dict[str, dict[str, Any]]:
    """``<name>.partial.json <record>`` lines -> {packed file name: record}; unreadable ones dropped
    (the packer redoes such a partial, so it counts as nothing kept)."""
    out: dict[str, dict[str, Any]] = {}
    for line in (text or "").splitlines():
        name, _, raw = line.strip().partition(" ")
        if not name.endswith(".partial.json"):
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict):
            out[name[:-len(".partial.json")]] = record
    return out


def config_of(facts: Mapping[str, Any]) -> dict[str, Any] | None:
    """The source config.json as read on the head (rank 0), else on any node that has one."""
    for nf in sorted(facts.values(), key=lambda v: v.get("rank", 99)):
        if nf.get("config"):
            return nf["config"]
    return None
