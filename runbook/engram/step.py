"""Library side of step ``03_engram``: ship the standalone tools, pack each node's rank, verify, probe.

The node-side work is done by stdlib-only scripts in this directory (``layout.py``, ``pack.py``,
``check.py``, ``probe.py``; ``synth.py`` for the lab fixture), copied side by side into a per-node
tools dir with ``node.put`` and run with the node's ``python3`` via ``node.run`` (docs/DESIGN.md,
remote layer). Each prints one JSON line last; the pure functions below turn those into ``Check``s.

What the notebook calls, in order (every function returns Checks; nothing raises on a node's
failure, the other node's answer is always kept)::

    enabled, reason = applicable(profile)            # ENGRAM=0 -> disabled_checks(profile, reason)
    prepare_lab_source(cluster, profile)             # RECIPE=lab only: synthetic V4.1-style source
    facts = gather_facts(cluster, profile)           # read-only: python, source files, free space
    source_checks(profile, facts); space_checks(profile, facts, config_of(facts))
    run_pack(cluster, profile, facts, results=results, skip=blocked_nodes(checks), stream=True)
    run_probe(cluster, profile, facts, results=results, skip=blocked_nodes(checks))
    record(step, results)                            # step.data["engram"] + raw/03_engram/*.json

Tested for real on the netns lab (tests/lab/test_engram_lab.py: ssh, node.put, parallel ranks,
resume after SIGKILL, corruption, tmpfs disk-full). NOT exercised anywhere yet: a root-owned packed
dir (``facts[node]["python"] = "sudo -n python3"``), an NFS-mounted source on the worker
(``facts[node]["engram_src_dir"]``), and the multi-hour ``PACK_TIMEOUT_S`` on real 47 GiB files.
"""
from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..checks import Check, CheckList, Status, check, not_applicable
from . import layout as L
from . import pack as P

HERE = Path(__file__).resolve().parent
TOOL_FILES = ("layout.py", "pack.py", "check.py", "probe.py", "slim.py")
LAB_TOOL_FILES = ("layout.py", "synth.py")
DEFAULT_TOOLS_DIR = "/tmp/spark-runbook-engram"
PACK_TIMEOUT_S = 4 * 3600          # 2 x 47 GiB per node; NFS-sourced worker reads are the slow part
CHECK_TIMEOUT_S = 600
PROBE_SECONDS = 5.0
LAB_FIXTURE_MARKER = ".lab-fixture.json"
LAB_FIXTURE_KIND = "runbook lab fixture: synthetic DeepSeek-V4.1-style Engram source (runbook.engram.synth)"
GIB, MIB = 1 << 30, 1 << 20
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
SOURCE_FIX = ("run the weights step (02_weights) so ENGRAM_SRC_DIR holds config.json, "
              "model.safetensors.index.json and the shards with layers.{1,14}.engram.embed.* "
              "(HF_ENGRAM_REPO shards 47/48); on the worker ENGRAM_SRC_DIR must show the head's files")


def tool_paths(files: Iterable[str] = TOOL_FILES) -> list[Path]:
    return [HERE / name for name in files]


def shell_path(path: str) -> str:
    """Quote a node path for a remote shell, keeping a leading ``~/`` expandable
    (``shlex.quote('~/x')`` would hand the shell a literal ``~``)."""
    path = str(path)
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def node_tools_dir(tools_dir: str, name: str) -> str:
    """One tools dir per node: two nodes may share /tmp (the lab does), and a file being replaced
    by one node's ``put`` must never be the script the other node is running."""
    return f"{tools_dir.rstrip('/')}/{name}"


def _node_name(spec) -> str:
    return getattr(spec, "name", "") or ("head" if spec.rank == 0 else f"worker{spec.rank if spec.rank > 1 else ''}")


def _node_facts(facts: Mapping[str, Any] | None, name: str) -> Mapping[str, Any]:
    return (facts or {}).get(name, {}) or {}


def _layers_arg(layers) -> list[str]:
    return ["--layers", ",".join(str(int(x)) for x in layers)] if layers else []


def _src_of(profile, nf: Mapping[str, Any]) -> str:
    return str(nf.get("engram_src_dir") or profile.engram_src_dir)


def _packed_of(profile, nf: Mapping[str, Any]) -> str:
    return str(nf.get("engram_packed_dir") or profile.engram_packed_dir)


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
            out.append(not_applicable(name, reason, node=_node_name(spec), expected=expected))
    return out


# -- plans (pure) -------------------------------------------------------------------------------

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
        name = _node_name(spec)
        nf = _node_facts(facts, name)
        if spec.rank >= tp:
            plans[name] = []           # more nodes than TP ranks: nothing to pack there
            continue
        py = str(nf.get("python", "python3"))
        src, out = shell_path(_src_of(profile, nf)), shell_path(_packed_of(profile, nf))
        tdir = node_tools_dir(tools_dir, name)
        common = ["--tp", str(tp), "--rank", str(spec.rank), *_layers_arg(layers)]
        pack_py, check_py = (shlex.quote(f"{tdir}/{f}") for f in ("pack.py", "check.py"))
        pack_extra = (["--progress-every", str(int(progress_every))] if progress_every is not None else [])
        pack_extra += [shlex.quote(str(a)) for a in extra_args]
        plans[name] = [
            f"mkdir -p {shlex.quote(tdir)}",
            " ".join([py, pack_py, "--src", src, "--out", out, *common, *pack_extra]),
            " ".join([py, check_py, "--src", src, "--packed", out, *common,
                      "--samples", str(int(check_samples))]),
        ]
    return plans


def plan_probe(profile, facts=None, *, tools_dir: str = DEFAULT_TOOLS_DIR, layer: int = 1,
               seconds: float = PROBE_SECONDS) -> dict[str, str]:
    """One read-probe command per packing node (reads only; run with ``node.read``)."""
    tp = int(profile.tp)
    out: dict[str, str] = {}
    for spec in profile.nodes:
        if spec.rank >= tp:
            continue
        name = _node_name(spec)
        nf = _node_facts(facts, name)
        packed = _packed_of(profile, nf).rstrip("/")
        f = shell_path(f"{packed}/{L.packed_name(layer, spec.rank, tp)}")
        out[name] = " ".join([str(nf.get("python", "python3")),
                              shlex.quote(f"{node_tools_dir(tools_dir, name)}/probe.py"),
                              "--file", f, "--qd", "1,64", "--seconds", str(seconds)])
    return out


def expected_files(profile, config: Mapping[str, Any], layers=None) -> dict[str, list[L.RankRange]]:
    """Per node: the rank ranges (and so exact file sizes) the packer must produce."""
    layout = L.EngramLayout.from_config(config, int(profile.tp))
    wanted = list(layers) if layers else list(layout.layer_ids)
    out: dict[str, list[L.RankRange]] = {}
    for spec in profile.nodes:
        if spec.rank < layout.tp:
            out[_node_name(spec)] = [layout.rank_range(layer, spec.rank) for layer in wanted]
    return out


def existing_complete_bytes(ranges: Iterable[L.RankRange], existing: Mapping[str, int]) -> int:
    """Bytes of final packed files whose size is already exact (the packer skips them after a
    header check). ``existing`` is {file name: size} as listed on the node."""
    return sum(r.packed_bytes for r in ranges if int(existing.get(r.file_name, -1)) == r.packed_bytes)


def partial_kept_bytes(ranges: Iterable[L.RankRange], existing: Mapping[str, int],
                       records: Mapping[str, Any], shard_sizes: Mapping[str, int] | None = None) -> int:
    """Bytes of ``.partial`` files the packer will keep (header + recorded rows), for files not
    complete yet. ``records``: {file name: the partial's progress record} as read on the node;
    ``shard_sizes``: the node's source files, to drop a record made from other shards (the packer
    redoes those; it also checks the mtimes and re-reads the last rows, which a laptop cannot)."""
    kept = 0
    for r in ranges:
        if int(existing.get(r.file_name, -1)) == r.packed_bytes:
            continue
        record = records.get(r.file_name)
        rows = P.recorded_rows(record, r, int(existing.get(r.file_name + ".partial", 0)))
        if rows and shard_sizes is not None and any(
                shard_sizes.get((record.get(k) or {}).get("shard")) != (record.get(k) or {}).get("size")
                for k in ("weight", "scale")):
            rows = 0
        if rows < r.rows:
            rows -= rows % P.ALIGN_ROWS            # the packer restarts on a 512-row boundary
        kept += L.HEADER_BYTES + rows * r.row_bytes if rows else 0
    return kept


def space_checks(profile, facts: Mapping[str, Any], config: Mapping[str, Any], layers=None) -> list[Check]:
    """Free space on each node's packed dir vs the bytes its rank still has to write. ``facts[node]``
    keys: ``packed_free_bytes`` (``df -B1 --output=avail``) and optionally ``packed_existing_bytes``
    (bytes of already complete files, which the packer skips) or ``packed_existing``
    ({file name: size} of ``engram-l*-r*of*.bin*`` in the packed dir) with ``packed_records``
    ({file name: progress record of its ``.partial``}: the recorded rows are not written again)."""
    out = []
    for name, ranges in expected_files(profile, config, layers).items():
        nf = _node_facts(facts, name)
        existing = nf.get("packed_existing") or {}
        have = nf.get("packed_existing_bytes")
        if have is None:
            have = existing_complete_bytes(ranges, existing)
        kept = partial_kept_bytes(ranges, existing, nf.get("packed_records") or {}, nf.get("src_files"))
        total = sum(r.packed_bytes for r in ranges)
        need = total - int(have or 0) - kept
        free = nf.get("packed_free_bytes")
        if free is None:
            out.append(not_applicable("engram packed dir free space", "free space not probed", node=name,
                                      expected=f">= {need} bytes"))
            continue
        packed = _packed_of(profile, nf)
        where = f"{packed} (filesystem {nf['packed_fs']})" if nf.get("packed_fs") else packed
        done = f"; {int(have) / GIB:.2f} GiB complete already" if have else ""
        done += f"; {kept / MIB:.1f} MiB kept in .partial files (resumed, not rewritten)" if kept else ""
        out.append(check("engram packed dir free space", int(free) >= need, node=name,
                         observed=f"{int(free) / GIB:.2f} GiB free on {where}{done}",
                         expected=f">= {need / GIB:.2f} GiB ({need} bytes) still to write ({len(ranges)} "
                                  f"file(s), {total / GIB:.2f} GiB in all)",
                         fix=f"free {max(need - int(free), 0)} bytes on {where} or point ENGRAM_PACKED_DIR at a "
                             "larger node-local NVMe path; a .partial resumes",
                         data={"free_bytes": int(free), "need_bytes": need, "total_bytes": total,
                               "complete_bytes": int(have or 0), "partial_kept_bytes": kept}))
    return out


# -- parsing tool output (pure) -------------------------------------------------------------

def parse_tool_json(stdout: str, tool: str) -> dict[str, Any]:
    """The last JSON line a tool printed (``{"tool": tool, ...}``), or ``{}``."""
    for line in reversed((stdout or "").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if obj.get("tool") == tool:
                return obj
    return {}


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


def _last_json(stdout: str) -> dict[str, Any]:
    for line in reversed((stdout or "").splitlines()):
        if line.strip().startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return {}


def parse_stat_lines(text: str) -> dict[str, int]:
    """``stat -c '%s %n'`` lines -> {base name: size}."""
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        size, _, path = line.strip().partition(" ")
        if size.isdigit() and path:
            out[path.rsplit("/", 1)[-1]] = int(size)
    return out


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


def blocked_nodes(checks: Iterable[Check]) -> set[str]:
    """Nodes with a failed check so far: later stages are not started there."""
    return {c.node for c in checks if c.failed and c.node}


def config_of(facts: Mapping[str, Any]) -> dict[str, Any] | None:
    """The source config.json as read on the head (rank 0), else on any node that has one."""
    for nf in sorted(facts.values(), key=lambda v: v.get("rank", 99)):
        if nf.get("config"):
            return nf["config"]
    return None


# -- cluster-facing ----------------------------------------------------------------------------

def ship_tools(node, tools_dir: str = DEFAULT_TOOLS_DIR, files: Iterable[str] = TOOL_FILES) -> str:
    """Copy the standalone scripts into this node's own tools dir; returns that dir."""
    tdir = node_tools_dir(tools_dir, node.name)
    node.run(f"mkdir -p {shlex.quote(tdir)}", timeout=30)
    for path in tool_paths(files):
        node.put(path, f"{tdir}/{path.name}")
    return tdir


def _is_dry(node, res=None) -> bool:
    return bool(getattr(res, "dry_run", False) or getattr(node, "dry_run", False))


def gather_facts(cluster, profile, facts: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Read-only, every node in parallel: python3 version, the source files (config.json, index,
    sizes) as this node sees ENGRAM_SRC_DIR, free bytes where the packed dir is (or would be), and
    packed files already there. ``facts`` (per-node overrides) are carried over."""
    def probe(node):
        nf: dict[str, Any] = dict(_node_facts(facts, node.name))
        nf["rank"] = node.spec.rank
        py = str(nf.get("python", "python3"))
        res = node.read(f"{py} -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'", timeout=20)
        nf["python_version"] = res.stdout.strip() if res.ok else ""
        try:
            nf["python_ok"] = tuple(int(x) for x in nf["python_version"].split(".")) >= (3, 8)
        except ValueError:
            nf["python_ok"] = False
        src = _src_of(profile, nf)
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
        packed = _packed_of(profile, nf)
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
                            f"printf '%s ' \"$f\"; head -c {P.RECORD_BYTES} \"$f\" | tr -d '\\n'; echo; done",
                            timeout=20)
            nf["packed_records"] = parse_records(res.stdout)
        return nf
    ranks = {n.name: n.spec.rank for n in cluster.nodes}
    return {name: (value if not isinstance(value, Exception) else
                   {"error": str(value).splitlines()[0], "rank": ranks.get(name, 99)})
            for name, value in cluster.each(probe).items()}


def engram_shards(nf: Mapping[str, Any]) -> list[str]:
    """Shard files that hold Engram tensors, per the node's index (or every *.safetensors)."""
    index = nf.get("index") or {}
    wm = index.get("weight_map") or {}
    shards = sorted({v for k, v in wm.items() if ".engram.embed." in k})
    if shards:
        return shards
    return sorted(n for n in nf.get("src_files", {}) if n.endswith(".safetensors"))


def source_checks(profile, facts: Mapping[str, Any]) -> list[Check]:
    """Per packing node: python3 usable; ENGRAM_SRC_DIR holds config.json, index and the Engram
    shards; the worker sees the same shard sizes as the head; the total matches ENGRAM_GIB."""
    out: list[Check] = []
    tp = int(profile.tp)
    head_sizes: dict[str, int] | None = None
    for name, nf in sorted(facts.items(), key=lambda kv: kv[1].get("rank", 99)):
        if nf.get("rank", 0) >= tp:
            continue
        if nf.get("error"):
            out.append(Check("engram source", name, Status.FAIL, observed=f"node not readable: {nf['error']}",
                             expected="ssh works", fix="see 00_preflight"))
            continue
        out.append(check("engram python3", bool(nf.get("python_ok")), node=name,
                         observed=f"{nf.get('python', 'python3')} {nf.get('python_version') or 'not found'}",
                         expected=">= 3.8 (the shipped tools are stdlib only)",
                         fix="install python3 (>= 3.8) on the node"))
        src, files = nf.get("src_dir", ""), nf.get("src_files") or {}
        missing = [f for f in ("config.json", L.INDEX_NAME) if f not in files]
        if nf.get("config_error") or nf.get("index_error"):
            missing.append(nf.get("config_error") or nf.get("index_error"))
        shards = engram_shards(nf)
        missing += [s for s in shards if s not in files]
        if not shards:
            missing.append("no shard with layers.*.engram.embed.* in the index")
        size = sum(files.get(s, 0) for s in shards)
        ok = not missing
        observed = (f"{src}: config.json, index, {', '.join(shards)} ({size / GIB:.3f} GiB)" if ok else
                    f"{src}: missing {', '.join(missing)}" if files else f"{src}: not found or empty")
        out.append(check("engram source", ok, node=name, observed=observed,
                         expected="config.json, model.safetensors.index.json and the Engram shards",
                         fix=SOURCE_FIX, data={"shards": {s: files.get(s) for s in shards}, "bytes": size}))
        if not ok:
            continue
        sizes = {s: files.get(s) for s in shards}
        if head_sizes is None:
            head_sizes = sizes
            if float(profile.engram_gib or 0) > 0:
                want = float(profile.engram_gib)
                out.append(check("engram source size", abs(size / GIB - want) <= 0.05 * want, node=name,
                                 observed=f"{size / GIB:.3f} GiB in {len(shards)} shard(s)",
                                 expected=f"ENGRAM_GIB={want} (+-5%)", warn_only=True,
                                 fix="check the shards are complete (02_weights verifies them) or correct ENGRAM_GIB",
                                 data={"bytes": size}))
        else:
            out.append(check("engram source parity", sizes == head_sizes, node=name,
                             observed="same shard sizes as the head" if sizes == head_sizes else
                             f"shard sizes {sizes} differ from the head's {head_sizes}",
                             expected="the worker reads the same source as the head",
                             fix="re-share the head's ENGRAM_SRC_DIR to this node (02_weights)"))
    return out


def precheck(profile, facts: Mapping[str, Any], layers=None) -> CheckList:
    """``source_checks`` then ``space_checks`` against the head's config.json; a config whose
    Engram layout does not add up is one FAIL row (the packer would refuse it too)."""
    checks = CheckList(source_checks(profile, facts))
    config = config_of(facts)
    if config is None:
        return checks
    try:
        checks.add(space_checks(profile, facts, config, layers))
    except (L.LayoutError, KeyError, TypeError, ValueError) as exc:
        checks.add(Check("engram layout", "head", Status.FAIL, observed=f"config.json refused: {exc}",
                         expected="engram_num_embeddings = the prime layout of engram_vocab_size",
                         fix=SOURCE_FIX))
    return checks


def run_pack(cluster, profile, facts=None, *, tools_dir: str = DEFAULT_TOOLS_DIR, layers=None,
             timeout: float = PACK_TIMEOUT_S, on_result: Callable[[str, dict], None] | None = None,
             results: dict[str, dict] | None = None, skip: Iterable[str] = (), stream: bool = False,
             check_samples: int = 256, progress_every: int | None = None,
             extra_args: Sequence[str] = ()) -> CheckList:
    """Ship the tools, pack and verify on every node in parallel; one CheckList for the step.

    ``skip``: nodes where an earlier check failed (not started, an N/A row says why).
    ``results``: filled with each node's raw tool summaries ({node: {"pack": …, "check": …}}).
    ``stream``: echo the packer's progress lines live (fabric ``hide=False``)."""
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
            return [not_applicable("engram pack", f"rank {node.spec.rank} >= TP: no Engram shard", node=node.name)]
        if node.name in skip:
            return [not_applicable("engram pack", "not started: a check above failed on this node",
                                   node=node.name, expected="pack and verify")]
        ship_tools(node, tools_dir)
        t0 = time.monotonic()
        res = node.run(cmds[1], timeout=timeout, warn=True, stream=stream)
        if _is_dry(node, res):
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
        if _is_dry(node):
            return [not_applicable("engram read probe", "dry-run: the packed files were not written",
                                   node=node.name)]
        res = node.read(cmds[node.name], timeout=seconds * 4 + 60)
        summary = parse_tool_json(res.stdout, "engram-probe")
        results.setdefault(node.name, {})["probe"] = {**summary, "exit": res.exit_code, "command": cmds[node.name]}
        return probe_checks(node.name, summary)

    for name, value in cluster.each(one).items():
        checks.add(value if not isinstance(value, Exception) else
                   [Check("engram read probe", name, Status.WARN, observed=str(value).splitlines()[0])])
    return checks


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
        if spec.rank >= int(profile.tp):
            continue
        node = cluster[_node_name(spec)]
        nf = _node_facts(facts, node.name)
        tdir = ship_tools(node, tools_dir)
        dst = f"{profile.cache_dir.rstrip('/')}/{SLIM_SUBDIR}"
        cmd = " ".join([str(nf.get("python", "python3")), shlex.quote(f"{tdir}/slim.py"),
                        "--src", shell_path(_src_of(profile, nf)), "--dst", shell_path(dst)]
                       + (["--symlink"] if profile.engram_source_shared_on(node.name) else []))
        res = node.run(cmd, timeout=600, warn=True)
        if _is_dry(node, res):
            out.append(not_applicable("engram slim source", "dry run", node=node.name))
            continue
        summary = _last_json(res.stdout)
        out.append(check("engram slim source", bool(summary.get("ok")), node=node.name,
                         observed=(f"{summary.get('tables')} tables in {', '.join(summary.get('shards', []))} "
                                   f"-> {summary.get('dst')} ({summary.get('files')})") if summary.get("ok")
                         else str(summary.get("error") or tail_line(res.stderr) or f"exit {res.exit_code}"),
                         expected="an Engram-only index, the Engram shards and config.json in CACHE_DIR/engram-src",
                         fix="rerun 02_weights (it downloads the Engram source), then this step",
                         data={"slim": summary}))
    return out


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


def record(step, results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Put the numbers into ``step.data["engram"]`` and every tool's raw JSON under raw/<step>/."""
    summary = summarize(results)
    step.data["engram"] = summary
    raw = {}
    for name, r in sorted(results.items()):
        for tool, value in sorted(r.items()):
            raw[f"{tool}-{name}"] = step.raw(f"{tool}-{name}.json", json.dumps(value, indent=1, sort_keys=True))
    step.data["engram_raw"] = raw
    return summary


# -- lab fixture --------------------------------------------------------------------------------

def _stat_files(node, directory: str) -> dict[str, int]:
    res = node.read(f"cd {shell_path(directory)} 2>/dev/null && stat -c '%s %n' -- * 2>/dev/null", timeout=20)
    return parse_stat_lines(res.stdout)


def _read_marker(node, directory: str) -> dict[str, Any] | None:
    res = node.read(f"cat {shell_path(directory.rstrip('/') + '/' + LAB_FIXTURE_MARKER)} 2>/dev/null", timeout=20)
    try:
        return json.loads(res.stdout) if res.ok and res.stdout.strip() else None
    except ValueError:
        return None


def _marker_matches(marker: Mapping[str, Any] | None, files: Mapping[str, int], vocab: int, seed: int) -> bool:
    if not marker or marker.get("kind") != LAB_FIXTURE_KIND:
        return False
    if marker.get("vocab") != vocab or marker.get("seed") != seed:
        return False
    want = marker.get("files") or {}
    return bool(want) and all(files.get(k) == v for k, v in want.items())


def rsync_command(src_dir: str, target_host: str, dst_dir: str) -> str:
    """Push head:src_dir to target_host:dst_dir over ssh (the fabric address), whole files."""
    ssh = "ssh -o BatchMode=yes -o StrictHostKeyChecking=yes"
    remote = dst_dir.removeprefix("~/")                               # rsync: relative = home
    return (f"rsync -a --whole-file --partial --mkpath --delete --stats -e {shlex.quote(ssh)} "
            f"{shell_path(src_dir.rstrip('/') + '/')} {shlex.quote(target_host + ':' + remote.rstrip('/') + '/')}")


def _rsync_stats(text: str) -> dict[str, int]:
    out = {}
    for key, pat in (("files", r"Number of regular files transferred:\s*([\d,]+)"),
                     ("bytes", r"Total transferred file size:\s*([\d,]+)")):
        m = re.search(pat, text or "")
        if m:
            out[key] = int(m.group(1).replace(",", ""))
    return out


def prepare_lab_source(cluster, profile, *, vocab: int | None = None, seed: int = 0,
                       tools_dir: str = DEFAULT_TOOLS_DIR) -> CheckList:
    """LAB FIXTURE (RECIPE=lab only): stand in for the weights step's Engram download.

    Generates a scaled-down V4.1-style source (``synth.py``: same tensor names, dtypes, shard
    names, index and a ``config.json`` consistent with the prime layout) in the head's
    ENGRAM_SRC_DIR, then shares it the way the recipe makes the worker read the head's source:
    here an ``rsync`` over ssh from the head to each worker's fabric address into the worker's
    node-private ENGRAM_SRC_DIR (the recipe uses an NFS export over the fabric). A marker file
    makes a re-run a NO-OP. Refuses to overwrite a dir that holds anything but its own fixture."""
    from . import synth
    if not profile.is_lab:
        raise ValueError(f"prepare_lab_source is a lab fixture; RECIPE={profile.recipe} must bring the real "
                         "Engram source (02_weights)")
    vocab = int(vocab or synth.DEFAULT_VOCAB)
    checks = CheckList()
    head, src = cluster.head, str(profile.engram_src_dir)
    name = "lab fixture: synthetic Engram source"
    files = _stat_files(head, src)
    marker = _read_marker(head, src)
    if _marker_matches(marker, files, vocab, seed):
        checks.add(Check(name, head.name, Status.NOOP,
                         observed=f"lab fixture: synthetic source present in {src} (vocab {vocab}, "
                                  f"{marker['bytes'] / MIB:.0f} MiB, marker matches), not regenerated",
                         expected="a V4.1-style Engram source on the head", data=dict(marker)))
    elif files and not marker:
        checks.add(Check(name, head.name, Status.FAIL,
                         observed=f"{src} holds {len(files)} file(s) that are not the lab fixture "
                                  f"({', '.join(sorted(files)[:4])}); not overwritten",
                         expected=f"an empty dir or the fixture's own files ({LAB_FIXTURE_MARKER})",
                         fix="empty ENGRAM_SRC_DIR on the head or point it at a fresh path"))
        return checks
    else:
        tdir = ship_tools(head, tools_dir, LAB_TOOL_FILES)
        t0 = time.monotonic()
        res = head.run(f"rm -f {shell_path(src.rstrip('/') + '/' + LAB_FIXTURE_MARKER)}; python3 "
                       f"{shlex.quote(tdir + '/synth.py')} --dst {shell_path(src)} --vocab {vocab} --seed {seed}",
                       timeout=900, warn=True)
        if _is_dry(head, res):
            checks.add(not_applicable(name, f"dry-run: would generate the synthetic source in {src} "
                                            f"(vocab {vocab})", node=head.name))
            return checks
        out = _last_json(res.stdout)
        if not res.ok or not out:
            checks.add(Check(name, head.name, Status.FAIL, observed=f"synth.py exit {res.exit_code}: "
                             f"{(res.stderr or res.stdout).strip().splitlines()[-1:] or ''}",
                             expected="a generated source", fix=f"free space on the head's {src} filesystem"))
            return checks
        files = _stat_files(head, src)
        marker = {"kind": LAB_FIXTURE_KIND, "vocab": vocab, "seed": seed, "bytes": out["bytes"],
                  "engram_num_embeddings": out.get("engram_num_embeddings"),
                  "files": {k: v for k, v in files.items() if k != LAB_FIXTURE_MARKER},
                  "generated_s": round(time.monotonic() - t0, 2)}
        head.run(f"printf '%s\\n' {shlex.quote(json.dumps(marker, sort_keys=True))} > "
                 f"{shell_path(src.rstrip('/') + '/' + LAB_FIXTURE_MARKER)}", timeout=30)
        checks.add(Check(name, head.name, Status.PASS,
                         observed=f"lab fixture: synthetic source generated in {src}: vocab {vocab}, "
                                  f"{len(marker['files'])} files, {out['bytes'] / MIB:.0f} MiB of tables "
                                  f"in {marker['generated_s']} s",
                         expected="a V4.1-style Engram source on the head (stands in for 02_weights)",
                         data=marker))
    head_files = {k: v for k, v in _stat_files(head, src).items()}
    for worker in cluster.workers:
        if worker.spec.rank >= int(profile.tp):
            continue
        wname = "lab fixture: source shared to worker"
        target = worker.spec.fabric_ip
        cmd = rsync_command(src, target, src)
        t0 = time.monotonic()
        res = head.run(cmd, timeout=900, warn=True)
        secs = time.monotonic() - t0
        if _is_dry(head, res):
            checks.add(not_applicable(wname, f"dry-run: not run: {cmd}", node=worker.name))
            continue
        stats = _rsync_stats(res.stdout)
        wfiles = _stat_files(worker, src)
        same = res.ok and wfiles == head_files
        how = f"rsync over ssh head -> {worker.name} fabric {target}"
        if same and stats.get("files") == 0:
            checks.add(Check(wname, worker.name, Status.NOOP,
                             observed=f"lab fixture: {how}: {src} identical already, nothing transferred",
                             expected="worker's ENGRAM_SRC_DIR = head's (the recipe NFS-shares it instead)",
                             data={"command": cmd, **stats}))
            continue
        observed = (f"lab fixture: {how}: {stats.get('files', '?')} file(s), "
                    f"{stats.get('bytes', 0) / MIB:.0f} MiB in {secs:.1f} s; sizes match the head"
                    if same else f"{how}: exit {res.exit_code}; worker has {len(wfiles)} file(s), head {len(head_files)}: "
                    f"{tail_line(res.stderr)}")
        checks.add(check(wname, same, node=worker.name, observed=observed,
                         expected="worker's ENGRAM_SRC_DIR = head's (the recipe NFS-shares it instead)",
                         fix="check node-to-node ssh over the fabric (00_preflight) and free space on the worker",
                         data={"command": cmd, "seconds": round(secs, 2), **stats}))
    return checks


def tail_line(text: str) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else ""
