"""LAB FIXTURE (RECIPE=lab only): the synthetic V4.1-style Engram source generated on the head in place of
02_weights' download, shared to each worker with rsync over the fabric, with its ``lab fixture: …`` rows. Step 03
reaches it through its site (``step.site.engram_source``, set by ``runbook.lab.site`` for RECIPE=lab).
"""
from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Mapping
from typing import Any

from ..checks import Check, CheckList, Status, check, not_applicable
from ..engram_tools.ship import (DEFAULT_TOOLS_DIR, LAB_TOOL_FILES, is_dry, last_json, parse_stat_lines, shell_path,
                                 ship_tools, tail_line)

LAB_FIXTURE_MARKER = ".lab-fixture.json"
LAB_FIXTURE_KIND = "runbook lab fixture: synthetic DeepSeek-V4.1-style Engram source (runbook.engram_tools.synth)"
MIB = 1 << 20


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
    from ..engram_tools import synth
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
        if is_dry(head, res):
            checks.add(not_applicable(name, f"dry-run: would generate the synthetic source in {src} "
                                            f"(vocab {vocab})", node=head.name))
            return checks
        out = last_json(res.stdout)
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
        if not profile.holds_rank(worker.spec.rank):
            continue
        wname = "lab fixture: source shared to worker"
        target = worker.spec.fabric_ip
        cmd = rsync_command(src, target, src)
        t0 = time.monotonic()
        res = head.run(cmd, timeout=900, warn=True)
        secs = time.monotonic() - t0
        if is_dry(head, res):
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
