"""The memory-bandwidth probe on every rank before and after the benchmark, and whether the bench is valid: a rank below 80 % of another (a GB10's hidden slow state reads ~70 instead of ~230 GB/s with nothing in nvidia-smi) makes the figures those of a sick node.

The probe is ``runbook/facts/membw_probe.py``, fed to the node's python through stdin (nothing copied):
on a GPU profile (EXPECT_GPU=1) the GPU path inside the serving container (docker runtime) or with
the python next to VLLM_BIN; on the lab the CPU path with ``python3``, labelled "CPU memory
bandwidth (lab)". Ranks are probed one after another, so two lab nodes sharing one host's memory do
not halve each other.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from ..checks import Check, Status, check
from ..facts import membw_probe

__all__ = ["FLOOR", "ROW", "VALID_ROW", "on_gpu", "probe_cmd", "parse_probe", "probe_ranks", "validity"]

FLOOR = 0.8                         # a rank below FLOOR x the fastest rank: the bench is invalid
ROW = "memory bandwidth"            # one row per node and phase: "memory bandwidth before bench"
VALID_ROW = "bench valid (memory bandwidth per rank)"
TIMEOUT_S = 120


def on_gpu(profile) -> bool:
    """The GPU path: EXPECT_GPU=1 on real nodes (a rehearsal on the lab keeps EXPECT_GPU but has no GPU)."""
    return bool(profile.expect_gpu) and not profile.lab


def probe_cmd(profile, node_name: str, python: str | None = None) -> str:
    """The shell command that runs the probe on one node (script through stdin, one JSON line out)."""
    gpu = on_gpu(profile)
    args = f"--json --device {'gpu' if gpu else 'cpu'}"
    script = Path(membw_probe.__file__).read_text()
    body = f"<<'RUNBOOK_MEMBW_EOF'\n{script}\nRUNBOOK_MEMBW_EOF"
    if gpu and profile.runtime == "docker":
        container = profile.container_on(node_name)
        return f"timeout {TIMEOUT_S} docker exec -i {shlex.quote(container)} python3 - {args} {body}"
    py = python or "python3"
    return f"timeout {TIMEOUT_S} {py} - {args} {body}"


def parse_probe(stdout: str) -> dict[str, Any]:
    """The probe's JSON line (``{"tool": "membw_probe", ...}``), or ``{"error": ...}``."""
    for line in reversed((stdout or "").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if obj.get("tool") == "membw_probe":
                return obj
    return {"tool": "membw_probe", "error": "no JSON line from the probe"}


def probe_ranks(cluster, profile, phase: str, python: str | None = None, *, raw_prefix: str = ""
                ) -> tuple[dict[str, dict[str, Any]], list[Check], dict[str, str]]:
    """Probe every node, one after another: ({node: result}, one row per node, {raw file name: text} for the
    caller to archive under ``raw_prefix``, the run-relative folder the rows' evidence names). ``phase``:
    before | after."""
    results: dict[str, dict[str, Any]] = {}
    rows, raws = [], {}
    for node in cluster.nodes:
        try:
            res = node.read(probe_cmd(profile, node.name, python), timeout=TIMEOUT_S + 30)
            text = (res.stdout or "") + (res.stderr or "")
            got = parse_probe(res.stdout) if not res.dry_run else {"error": "dry run"}
        except Exception as exc:  # noqa: BLE001 - an unreachable node is a row, never the end of the bench
            text, got = f"{type(exc).__name__}: {exc}", {"tool": "membw_probe", "error": f"{type(exc).__name__}: {exc}"}
        raw_name = f"membw_{phase}_{node.name}.json"
        raws[raw_name] = text
        ev = f"{raw_prefix}/{raw_name}" if raw_prefix else raw_name
        results[node.name] = got
        name = f"{ROW} {phase} bench"
        if got.get("error"):
            rows.append(Check(name, node=node.name, status=Status.WARN, observed=f"probe failed: {got['error']}",
                              expected="the probe's GB/s", evidence=[ev],
                              fix="run runbook/facts/membw_probe.py --json on the node by hand: a GPU profile "
                                  "needs torch with CUDA in the serving container (or next to VLLM_BIN)"))
            continue
        rows.append(check(name, True, node=node.name,
                          observed=f"{got['gbs']:.1f} GB/s ({got.get('label', '')}; {got.get('name', '')})",
                          expected="measured", evidence=[ev],
                          data={"gbs": got["gbs"], "device": got.get("device"), "method": got.get("method")}))
    return results, rows, raws


def validity(probes: dict[str, dict[str, dict[str, Any]]], *, gpu: bool) -> tuple[bool | None, Check]:
    """Valid when every rank, in every phase, reads at least FLOOR x the fastest rank of that phase.
    None (N/A row) when fewer than two ranks were measured. A FAIL on GPUs; on the lab a WARN (its
    nodes share one host's memory and CPU, so a gap says how busy this box was, not that a node is sick)."""
    worst: tuple[float, str, str, float] | None = None
    measured = 0
    for phase, by_node in probes.items():
        ok = {n: r["gbs"] for n, r in by_node.items() if not r.get("error") and r.get("gbs")}
        if len(ok) < 2:
            continue
        measured += 1
        top = max(ok.values())
        for n, v in ok.items():
            ratio = v / top
            if worst is None or ratio < worst[0]:
                worst = (ratio, n, phase, v)
    if not measured or worst is None:
        return None, Check(VALID_ROW, node="cluster", status=Status.NA, observed="fewer than two ranks measured",
                           expected=f"every rank >= {FLOOR:.0%} of the fastest")
    ratio, node, phase, v = worst
    valid = ratio >= FLOOR
    bad = Status.FAIL if gpu else Status.WARN
    summary = "; ".join(f"{p}: " + ", ".join(f"{n} {r.get('gbs', 0):.1f}" for n, r in sorted(b.items())
                                               if not r.get("error")) for p, b in probes.items())
    return valid, Check(VALID_ROW, node="cluster", status=Status.PASS if valid else bad,
                        observed=f"slowest {node} {phase} the bench at {v:.1f} GB/s = {ratio:.0%} of the fastest "
                                 f"rank ({summary} GB/s)",
                        expected=f"every rank >= {FLOOR:.0%} of the fastest, before and after",
                        fix="" if valid else (
                            "a GB10 slow state: power the slow node off for 30-60 s (a reboot does not clear it; a "
                            "newer BIOS/driver removed it) and run 07 again; the figures of this run are not the "
                            "hardware's" if gpu else
                            "the lab's nodes share this host: something else used its memory; run 07 again on an "
                            "idle machine"),
                        data={"valid": valid, "floor": FLOOR, "worst_ratio": ratio, "node": node, "phase": phase})
