"""Packing for step ``03_engram`` on the cluster: whether the profile packs at all, then pack and verify each node's
rank (``pack.py`` then ``check.py``, every node in parallel) into rows, and the numbers recorded.

What ``engram.run`` calls, in order (every function returns Checks; nothing raises on a node's
failure, the other node's answer is always kept)::

    enabled, reason = applicable(profile)            # ENGRAM=0 -> disabled_checks(profile, reason)
    step.site.engram_source(cluster, profile)        # the lab (RECIPE=lab) only: synthetic V4.1-style source
    facts = facts.gather_facts(cluster, profile)     # read-only: python, source files, free space
    precheck.precheck(profile, facts)                # source rows, then free space vs bytes still to write
    run_pack(cluster, profile, facts, results=results, skip=blocked_nodes(checks), stream=True)
    slim_source.make_slim_source(cluster, profile, facts)     # recipe A's /engram-src (N/A elsewhere)
    read_probe.run_probe(cluster, profile, facts, results=results, skip=blocked_nodes(checks))
    record(step, results)          # in __init__: step.data["engram"] + raw/03_engram/*.json

Shipping and running the node-side tools: ``tools.py``. Tested for real on the netns lab
(tests/lab/test_engram_lab.py: ssh, node.put, parallel ranks, resume after SIGKILL, corruption, tmpfs
disk-full). NOT exercised anywhere yet: a root-owned packed dir (``facts[node]["python"] = "sudo -n
python3"``), an NFS-mounted source on the worker (``facts[node]["engram_src_dir"]``), and the
multi-hour ``PACK_TIMEOUT_S`` on real 47 GiB files.
"""
from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import progress
from ..checks import Check, CheckList, Status, check, not_applicable
from ..records import EngramRank, EngramRecord
from ..engram_tools.ship import (DEFAULT_TOOLS_DIR, is_dry, node_facts, node_tools_dir, packed_of, parse_tool_json,
                    shell_path, ship_tools, src_of)

PACK_TIMEOUT_S = 4 * 3600          # 2 x 47 GiB per node; NFS-sourced worker reads are the slow part
CHECK_TIMEOUT_S = 600
MIB = 1 << 20
EXIT_FIX = {
    2: "the source was refused (see error): point ENGRAM_SRC_DIR at the V4.1 checkpoint dir holding "
       "config.json, model.safetensors.index.json and shards 47/48; re-download a truncated shard",
    3: "free space on the ENGRAM_PACKED_DIR filesystem (bytes needed are in the error) or point "
       "ENGRAM_PACKED_DIR at a larger node-local NVMe path; a kept .partial resumes",
    4: "I/O error: check the disk/NFS mount (dmesg) and re-run; the packer resumes from its last sync",
    5: "another pack.py still writes this rank's files (an earlier run that timed out?): wait for it to end "
       "or stop it (fuser -v on the .partial named in the error), then re-run",
}
STOPPED_FIX = ("the packer was stopped by a signal (SIGTERM/SIGHUP/SIGINT record the rows written, SIGKILL "
               "loses those since the last --sync-mib): re-run; it resumes from the recorded row")


def exit_fix(code: int) -> str:
    """The fix for a pack.py exit code (128 + N: stopped by signal N)."""
    return STOPPED_FIX if code >= 128 else EXIT_FIX.get(code, EXIT_FIX[4])


# -- applicability ------------------------------------------------------------------------------

STAGES = (
    ("engram source", "ENGRAM_SRC_DIR holds config, index and the Engram shards"),
    ("engram packed dir free space", "room for this rank's packed files"),
    ("engram pack", "engram-l{L}-r{rank}of{TP}.bin per layer"),
    ("engram packed verify", "header, size and sampled rows match the source"),
    ("engram read probe", "random 264-byte row reads at QD 1 and 64"),
)


def applicable(profile) -> tuple[bool, str]:
    """Whether this profile packs Engram tables, and why (one line for the notebook)."""
    if not profile.engram:
        return False, (f"ENGRAM=0 on profile {profile.profile_name} (RECIPE={profile.recipe}): only "
                       "DeepSeek-V4.1 has Engram tables; nothing to pack")
    if profile.is_lab:
        return True, ("ENGRAM=1 on the lab: a synthetic V4.1-style source (lab fixture) is packed on "
                      "both nodes to exercise the step; the launch step mounts packed files only for exl3-v41")
    return True, (f"ENGRAM=1 (RECIPE={profile.recipe}): pack rank r's rows of every Engram layer into "
                  f"{profile.engram_packed_dir} on the node running rank r")


def disabled_checks(profile, reason: str | None = None) -> list[Check]:
    """One N/A row per stage, per packing node, carrying the reason."""
    reason = reason or applicable(profile)[1]
    out = []
    for spec in profile.nodes:
        for name, expected in STAGES:
            out.append(not_applicable(name, reason, node=spec.name, expected=expected))
    return out


# -- the pack plan (pure) ------------------------------------------------------------------------

def _layers_arg(layers) -> list[str]:
    return ["--layers", ",".join(str(int(x)) for x in layers)] if layers else []


def plan_pack(profile, facts: Mapping[str, Any] | None = None, *, tools_dir: str = DEFAULT_TOOLS_DIR,
              layers=None, check_samples: int = 256, progress_every: int | None = None,
              extra_args: Sequence[str] = ()) -> dict[str, list[str]]:
    """Commands per node name, in order: make the tools dir, pack this node's rank, verify it.

    ``facts[node]`` may override ``python`` (default ``python3``; e.g. ``sudo -n python3`` for a
    root-owned packed dir), ``engram_src_dir`` (e.g. the worker's NFS mount of the head's source)
    and ``engram_packed_dir``. Shipping the tools is ``ship_tools`` (``node.put``), not a command.
    ``extra_args`` go to pack.py only (e.g. ``--chunk-rows 512 --sync-mib 1`` in tests).
    """
    tp = int(profile.tp)
    plans: dict[str, list[str]] = {}
    for spec in profile.nodes:
        name = spec.name
        nf = node_facts(facts, name)
        if not profile.holds_rank(spec.rank):
            plans[name] = []           # more nodes than TP x PP ranks: nothing to pack there
            continue
        py = str(nf.get("python", "python3"))
        src, out = shell_path(src_of(profile, nf)), shell_path(packed_of(profile, nf))
        tdir = node_tools_dir(tools_dir, name)
        # the rank within its pipeline stage: a stage-1 node packs the same shard as its stage-0 twin
        common = ["--tp", str(tp), "--rank", str(profile.tp_rank(spec.rank)), *_layers_arg(layers)]
        pack_py, check_py = (shell_path(f"{tdir}/{f}") for f in ("pack.py", "check.py"))
        pack_extra = (["--progress-every", str(int(progress_every))] if progress_every is not None else [])
        pack_extra += [shlex.quote(str(a)) for a in extra_args]
        plans[name] = [
            f"mkdir -p {shell_path(tdir)}",
            " ".join([py, pack_py, "--src", src, "--out", out, *common, *pack_extra]),
            " ".join([py, check_py, "--src", src, "--packed", out, *common,
                      "--samples", str(int(check_samples))]),
        ]
    return plans


# -- rows from the tools' summaries (pure) --------------------------------------------------

def pack_checks(node: str, summary: Mapping[str, Any], exit_code: int = 0) -> list[Check]:
    if not summary:
        return [Check("engram pack", node, Status.FAIL, observed=f"no summary line (exit {exit_code})",
                      expected="a JSON summary from pack.py", fix=exit_fix(exit_code))]
    if not summary.get("ok"):
        code = int(summary.get("exit_code", exit_code) or exit_code)
        return [Check("engram pack", node, Status.FAIL, observed=str(summary.get("error", "")),
                      expected="packed files", fix=exit_fix(code), data=dict(summary))]
    out = []
    for f in summary.get("files", []):
        status = Status.NOOP if f.get("status") == "skipped" else Status.PASS
        fname = Path(str(f.get("path", ""))).name
        if status is Status.NOOP:
            observed = f"{fname} complete already (header and size match), skipped"
        else:
            resumed = f" from row {f.get('resumed_from_row')}" if f.get("status") == "resumed" else ""
            observed = (f"{fname} {f.get('status')}{resumed}: {f.get('bytes', 0) / MIB:.1f} MiB "
                        f"in {f.get('seconds', 0)} s at {f.get('mb_s', 0)} MB/s")
        out.append(Check(f"engram pack L{f.get('layer')}", node, status, observed=observed,
                         expected=f"rows [{f.get('lo')}, {f.get('hi')}) = {f.get('bytes')} bytes",
                         data={k: f.get(k) for k in ("path", "lo", "hi", "bytes", "seconds", "mb_s", "status",
                                                     "resumed_from_row")}))
    rss = int(summary.get("peak_rss_bytes", 0) or 0)
    written = int(summary.get("bytes_written", 0) or 0)
    rate = (f"; wrote {written / MIB:.1f} MiB in {summary.get('seconds')} s = {summary.get('mb_s')} MB/s"
            if written else "; nothing to write")
    out.append(check("engram pack memory", rss <= 1 << 30, node=node,
                     observed=f"peak RSS {rss / MIB:.0f} MiB{rate}",
                     expected="<= 1024 MiB", warn_only=True, fix="lower --chunk-mib",
                     data={"peak_rss_bytes": rss, "bytes_written": written, "mb_s": summary.get("mb_s"),
                           "seconds": summary.get("seconds")}))
    return out


def check_checks(node: str, summary: Mapping[str, Any], exit_code: int = 0) -> list[Check]:
    if not summary or "files" not in summary:
        return [Check("engram packed verify", node, Status.FAIL,
                      observed=str(summary.get("error", f"no result (exit {exit_code})")) if summary else
                      f"no result (exit {exit_code})", expected="check.py JSON", fix=EXIT_FIX[2])]
    out = []
    for f in summary["files"]:
        fname = Path(str(f.get("path", ""))).name
        problems = "; ".join(f.get("problems", []))
        out.append(check(f"engram packed L{f.get('layer')} verify", bool(f.get("ok")), node=node,
                         observed=f"{fname}: {problems}" if problems else
                         f"{fname}: header, size and {f.get('rows_checked')} sampled rows match the source",
                         expected="header/size match, sampled rows byte-identical",
                         fix=f"delete {f.get('path')} and re-run this step (it is rebuilt from the source)",
                         data={"path": f.get("path"), "rows_checked": f.get("rows_checked"),
                               "bytes": f.get("bytes"), "problems": f.get("problems", [])}))
    return out


def blocked_nodes(checks: Iterable[Check]) -> set[str]:
    """Nodes with a failed check so far: later stages are not started there."""
    return {c.node for c in checks if c.failed and c.node}


# -- cluster-facing ----------------------------------------------------------------------------

def run_pack(cluster, profile, facts=None, *, tools_dir: str = DEFAULT_TOOLS_DIR, layers=None,
             timeout: float = PACK_TIMEOUT_S, on_result: Callable[[str, dict], None] | None = None,
             results: dict[str, dict] | None = None, skip: Iterable[str] = (), stream: bool = False,
             check_samples: int = 256, progress_every: int | None = None,
             extra_args: Sequence[str] = (), plans: Mapping[str, list[str]] | None = None) -> CheckList:
    """Ship the tools, pack and verify on every node in parallel; one CheckList for the step.

    ``plans``: the commands to run (:func:`plan_pack`'s, so what a step showed is what runs); default: the plan
    of the arguments here.
    ``skip``: nodes where an earlier check failed (not started, an N/A row says why).
    ``results``: filled with each node's raw tool summaries ({node: {"pack": …, "check": …}}).
    ``stream``: the packer's output live, its counting lines through ``runbook.progress`` (one count per node
    and shard file), the rest echoed."""
    if plans is None:
        plans = plan_pack(profile, facts, tools_dir=tools_dir, layers=layers, check_samples=check_samples,
                          progress_every=progress_every, extra_args=extra_args)
    skip = set(skip)
    checks = CheckList()
    results = results if results is not None else {}

    def note(name: str, key: str, value: Any) -> None:
        results.setdefault(name, {})[key] = value
        if on_result:
            on_result(name, {key: value})

    def one(node) -> list[Check]:
        cmds = plans.get(node.name, [])
        if not cmds:
            return [not_applicable("engram pack", f"node rank {node.spec.rank} >= TP x PP: no vLLM rank, no Engram "
                                   "shard", node=node.name)]
        if node.name in skip:
            return [not_applicable("engram pack", "not started: a check above failed on this node",
                                   node=node.name, expected="pack and verify")]
        ship_tools(node, tools_dir)
        t0 = time.monotonic()
        with progress.relay(f"{node.name} ") if stream else contextlib.nullcontext() as relay:
            res = node.run(cmds[1], timeout=timeout, warn=True, lines=relay)
        if is_dry(node, res):
            node.run(cmds[2], timeout=CHECK_TIMEOUT_S, warn=True)     # recorded too: the verify that follows
            return [not_applicable("engram pack", f"dry-run: not run: {cmds[1]}", node=node.name,
                                   expected="pack and verify")]
        summary = parse_tool_json(res.stdout, "engram-pack")
        note(node.name, "pack", {**summary, "exit": res.exit_code, "wall_s": round(time.monotonic() - t0, 3),
                                 "command": cmds[1]})
        got = pack_checks(node.name, summary, res.exit_code)
        if any(c.failed for c in got):
            return got
        res = node.run(cmds[2], timeout=CHECK_TIMEOUT_S, warn=True)
        summary = parse_tool_json(res.stdout, "engram-check")
        note(node.name, "check", {**summary, "exit": res.exit_code, "command": cmds[2]})
        return got + check_checks(node.name, summary, res.exit_code)

    for name, value in cluster.each(one).items():
        if isinstance(value, Exception):
            checks.add(Check("engram pack", name, Status.FAIL, observed=str(value).splitlines()[0],
                             expected="pack and verify ran", fix=getattr(value, "fix", "") or EXIT_FIX[4]))
        else:
            checks.add(value)
    return checks


# -- the numbers recorded ------------------------------------------------------------------------

def engram_record(profile, facts: Mapping[str, Mapping[str, Any]], summary: Mapping[str, Any]) -> EngramRecord:
    """Step 03's record: each packing rank's packed dir and the files packed (or found complete) and verified
    there (``summary``: :func:`summarize`'s); ENGRAM=0 (``facts`` empty): no rank."""
    ranks = []
    for name, nf in facts.items():
        rank = int(nf.get("rank", 0))
        if not profile.holds_rank(rank):
            continue
        node = summary.get(name) or {}
        verify = node.get("verify") or {}
        ranks.append(EngramRank(node=name, rank=profile.tp_rank(rank), stage=profile.pp_stage(rank),
                                packed_dir=packed_of(profile, nf),
                                files=tuple(sorted((node.get("pack") or {}).get("files") or {})),
                                verified=verify.get("ok") if verify else None))
    return EngramRecord(enabled=bool(profile.engram), tp=int(profile.tp),
                        ranks=tuple(sorted(ranks, key=lambda r: (r.stage, r.rank))))


def summarize(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The numbers a report recomputes from: per node pack MB/s, RSS, verify rows, probe IOPS."""
    out: dict[str, Any] = {}
    for name, r in sorted(results.items()):
        node: dict[str, Any] = {}
        p = r.get("pack") or {}
        if p:
            node["pack"] = {"ok": p.get("ok"), "exit": p.get("exit"), "mb_s": p.get("mb_s"),
                            "seconds": p.get("seconds"), "wall_s": p.get("wall_s"),
                            "bytes_written": p.get("bytes_written"),
                            "peak_rss_mib": round(int(p.get("peak_rss_bytes", 0) or 0) / MIB, 1),
                            "files": {Path(str(f.get("path", ""))).name:
                                      {k: f.get(k) for k in ("status", "bytes", "mb_s", "seconds", "resumed_from_row")}
                                      for f in p.get("files", [])}}
        c = r.get("check") or {}
        if c:
            node["verify"] = {"ok": c.get("ok"), "files": {Path(str(f.get("path", ""))).name:
                                                           {"ok": f.get("ok"), "rows_checked": f.get("rows_checked")}
                                                           for f in c.get("files", [])}}
        pr = r.get("probe") or {}
        if pr:
            node["probe"] = {"mode": pr.get("mode"), "file": Path(str(pr.get("file", ""))).name,
                             **{f"qd{x['qd']}": {"iops": x.get("iops"), "p50_us": x["lat_us"].get("p50"),
                                                 "p99_us": x["lat_us"].get("p99"), "seconds": x.get("seconds")}
                                for x in pr.get("results", [])}}
        out[name] = node
    return out
