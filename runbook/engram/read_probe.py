"""The read probe: ``probe.py`` on each packing node's packed layer file (random one-row reads at QD 1
and 64, read-only) and its WARN-only ``engram read probe …`` rows.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..checks import Check, CheckList, Status, check, not_applicable
from ..engram_tools import layout as L
from ..engram_tools.ship import (DEFAULT_TOOLS_DIR, is_dry, node_facts, node_tools_dir, packed_of, parse_tool_json,
                    shell_path)

PROBE_SECONDS = 5.0


def plan_probe(profile, facts=None, *, tools_dir: str = DEFAULT_TOOLS_DIR, layer: int = 1,
               seconds: float = PROBE_SECONDS) -> dict[str, str]:
    """One read-probe command per packing node (reads only; run with ``node.read``)."""
    tp = int(profile.tp)
    out: dict[str, str] = {}
    for spec in profile.nodes:
        if not profile.holds_rank(spec.rank):
            continue
        name = spec.name
        nf = node_facts(facts, name)
        packed = packed_of(profile, nf).rstrip("/")
        f = shell_path(f"{packed}/{L.packed_name(layer, profile.tp_rank(spec.rank), tp)}")
        out[name] = " ".join([str(nf.get("python", "python3")),
                              shell_path(f"{node_tools_dir(tools_dir, name)}/probe.py"),
                              "--file", f, "--qd", "1,64", "--seconds", str(seconds)])
    return out


def probe_checks(node: str, summary: Mapping[str, Any], *, min_qd1_iops: float = 0.0) -> list[Check]:
    if not summary.get("results"):
        return [Check("engram read probe", node, Status.WARN,
                      observed=str(summary.get("error", "no result")), expected="probe.py JSON")]
    out = []
    for r in summary["results"]:
        ok = r["qd"] != 1 or r["iops"] >= min_qd1_iops
        out.append(check(f"engram read probe QD{r['qd']}", ok, node=node, warn_only=True,
                         observed=f"{r['iops']:.0f} IOPS, p50 {r['lat_us']['p50']} us, p99 {r['lat_us']['p99']} us "
                                  f"({summary.get('mode')}, {r.get('seconds')} s)",
                         expected=f">= {min_qd1_iops:.0f} IOPS" if r["qd"] == 1 and min_qd1_iops else "recorded",
                         fix="packed dir should be on local NVMe, not NFS", data=dict(r)))
    return out


def run_probe(cluster, profile, facts=None, *, tools_dir: str = DEFAULT_TOOLS_DIR, layer: int = 1,
              seconds: float = PROBE_SECONDS, results: dict[str, dict] | None = None,
              skip: Iterable[str] = ()) -> CheckList:
    """Random one-row reads on each node's packed layer file (WARN-only rows; read-only)."""
    cmds = plan_probe(profile, facts, tools_dir=tools_dir, layer=layer, seconds=seconds)
    checks = CheckList()
    skip = set(skip)
    results = results if results is not None else {}

    def one(node):
        if node.name not in cmds:
            return []
        if node.name in skip:
            return [not_applicable("engram read probe", "not started: a check above failed on this node",
                                   node=node.name)]
        res = node.read(cmds[node.name], timeout=seconds * 4 + 60)    # read-only: runs in a dry run too
        if is_dry(node):
            return [not_applicable("engram read probe", "dry-run: the packed files were not written",
                                   node=node.name)]
        summary = parse_tool_json(res.stdout, "engram-probe")
        results.setdefault(node.name, {})["probe"] = {**summary, "exit": res.exit_code, "command": cmds[node.name]}
        return probe_checks(node.name, summary)

    for name, value in cluster.each(one).items():
        checks.add(value if not isinstance(value, Exception) else
                   [Check("engram read probe", name, Status.WARN, observed=str(value).splitlines()[0])])
    return checks
