"""Collect a diagnose bundle from every node over the remote layer, write it, and match the catalogue.

    archive, findings = diagnose(cluster, profile, run_dir, redactor, local={...}, state_dirs={...})

``local`` holds what the caller gathered on the runbook's machine (the rendered launch plan, /health,
/v1/models, two /metrics samples, the run's commands.jsonl); the caller knows the launch plan and the API,
this package does not (it sits below the step packages).
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from ..facts import rdma
from ..secrets import Redactor
from .archive import read_bundle, write_bundle
from .bundle import LOCAL, Context, collect_commands
from .match import Finding, match


def fabric_ends(cluster) -> dict[str, dict[str, list[str]]]:
    """Each reachable node's given fabric interfaces with the addresses it has (``ip -j addr``, ``ibdev2netdev``
    for its HCAs' netdevs), so the pings go over the path each pair shares (a node not read: its profile address)."""
    read = cluster.each(lambda node: rdma.read_fabric(node, timeout=15)[1])
    return {name: value for name, value in read.items() if isinstance(value, dict)}


def collect(cluster, profile, *, state_dirs: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Every node's texts (``texts[node][name]``), collected in parallel; a node that cannot be reached
    gets one text saying why, so the bundle still shows the others."""
    commands = collect_commands(profile, state_dirs=state_dirs, fabric=fabric_ends(cluster))

    def gather(node) -> dict[str, str]:
        texts: dict[str, str] = {}
        for command in commands.get(node.name, []):
            try:
                res = node.read(command.cmd, timeout=command.timeout)
            except Exception as exc:  # noqa: BLE001 - a timed-out probe is itself evidence
                texts[command.name] = f"({type(exc).__name__}: {str(exc)[:300]})"
                continue
            texts[command.name] = res.stdout + (f"\n--- stderr ---\n{res.stderr}" if res.stderr.strip() else "")
        return texts

    out: dict[str, dict[str, str]] = {}
    for name, value in cluster.each(gather).items():
        out[name] = value if isinstance(value, dict) else {"unreachable.txt": f"{type(value).__name__}: {value}"}
    return out


def diagnose(cluster, profile, run_dir: str | Path, redactor: Redactor, *,
             local: Mapping[str, str] | None = None, state_dirs: Mapping[str, str] | None = None,
             timings: Mapping[str, float] | None = None,
             extra: Mapping[str, Mapping[str, str]] | None = None) -> tuple[Path, list[Finding]]:
    """Collect from every node, write ``<run_dir>/diagnose/diagnose-<stamp>.tar.gz`` with its pages, and
    return the archive and the catalogue entries that match (most severe first). ``extra``: node -> texts the
    caller already has for that node (a failed ``docker pull``'s output), added to what is collected."""
    started = time.monotonic()
    texts = collect(cluster, profile, state_dirs=state_dirs)
    for node, items in (extra or {}).items():
        texts.setdefault(node, {}).update(items)
    if local:
        texts[LOCAL] = dict(local)
    timings = {**(timings or {}), "collected_at": time.time()}
    archive = write_bundle(run_dir, texts, redactor, context=Context.from_profile(profile), timings=timings)
    findings = match(read_bundle(archive))
    print(f"diagnose: {len(texts) - (1 if local else 0)} node(s) collected in {time.monotonic() - started:.1f} s "
          f"-> {archive}")
    return archive, findings
