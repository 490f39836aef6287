"""Did every rank attach its packed Engram shards? Read from the rank's own boot log (row ``engram attached``).

Recipe A serves the Engram tables from the native checkpoint and attaches, per layer, the node-local packed file
``engram-l{L}-r{rank}of{tp}.bin`` that step 03 wrote (one 264-byte read per miss instead of two, and no NFS hop on
a worker). When the file is missing, or its header is not this rank's (``does not match this rank … ignoring,
using checkpoint``), the rank boots anyway and serves from the checkpoint: prefill 25-50 % slower (seed A README),
and nothing else in 04 or 05 fails. So this row fails then, naming the file and the fix. The lines and their
sources: ``facts/engram_log.py``.

    rows = attach_checks(profile, plan, logs, reused=False)     # one row per rank; N/A when ENGRAM=0
"""
from __future__ import annotations

from ..checks import Check, check, not_applicable
from ..facts import engram_log

__all__ = ["ROW", "attach_checks", "packed_files", "serves_packed_engram"]

ROW = "engram attached"


def serves_packed_engram(profile) -> bool:
    """Recipe A (and the lab's stand-in for it) attach packed shards; seed B's models have no Engram tables."""
    return bool(profile.engram) and profile.recipe != "dspark-v4"


def tp_ranks(profile, node_rank: int) -> list[int]:
    """The tensor-parallel ranks one node runs, each within its pipeline stage (one per node on Sparks: TP x PP =
    NNODES; a stage-1 node runs the same TP rank, and attaches the same shards, as its stage-0 twin)."""
    per_node = max(1, (profile.tp * profile.pp) // max(1, profile.nnodes))
    return [profile.tp_rank(node_rank * per_node + i) for i in range(per_node)]


def packed_files(profile, node_rank: int, layers) -> list[str]:
    """The packed files a node's ranks should attach, as ENGRAM_PACKED_DIR names them (``~`` kept: each node's)."""
    d = (profile.engram_packed_dir or "ENGRAM_PACKED_DIR").rstrip("/")
    return [f"{d}/engram-l{layer}-r{r}of{profile.tp}.bin" for r in tp_ranks(profile, node_rank) for layer in layers]


def _fix(profile, files: list[str], *, why: str) -> str:
    where = ", ".join(files)
    return (f"{why}. The rank serves Engram from the checkpoint instead: prefill 25-50 % slower (two reads per "
            f"miss, over NFS on a worker). Re-pack with step 03 (03_engram: packs and verifies {where}; a file "
            f"whose header is wrong is replaced), then restart the server (python -m runbook stop, then 04). If "
            f"03 passes and the rank still ignores the file, the serving reader expects another header version: "
            f"compare the first 48 bytes (magic, layer, lo, hi, rows, 264; docs/engram.md 'Packed file format') "
            f"with the image's row_store and the TP split (TP={profile.tp})")


def _rank_row(profile, r, text: str, *, reused: bool) -> Check:
    report = engram_log.parse_engram_log(text)
    ranks = tp_ranks(profile, r.rank)
    attached = {k: a for k, a in report.layers.items() if a.rank in ranks}
    layers = sorted({a.layer for a in attached.values()} | {i.layer for i in report.ignored}
                    | set(report.stats)) or [1, 14]
    files = packed_files(profile, r.rank, layers)
    expected = (f"every Engram layer of rank {'/'.join(map(str, ranks))} reports packed=True "
                f"({', '.join(f.rsplit('/', 1)[-1] for f in files)} attached)")
    data = {"engram": report.to_dict(), "packed_files": files,
            "packed_dir_given": r.env.get("DSV41_PACKED_DIR", "")}
    if report.aborts:
        return check(ROW, False, node=r.node, observed="the rank aborted reading Engram: " + " | ".join(report.aborts),
                     expected=expected, data=data,
                     fix=_fix(profile, files, why="a packed file is present but unreadable (no header, or "
                                                  "truncated): the row store aborts the rank"))
    if report.ignored:
        lines = " | ".join(i.line for i in report.ignored[:4])
        return check(ROW, False, node=r.node, observed=f"fell back to the checkpoint: {lines}", expected=expected,
                     data=data, fix=_fix(profile, [f for f in files if any(f"engram-l{i.layer}-" in f
                                                                             for i in report.ignored)],
                                         why="the packed file's header does not match this rank "
                                             "(magic, layer, row range, rows or row size)"))
    if not attached and not report.stats:
        if reused:
            return not_applicable(ROW, "reused server: the boot lines may have rotated out and no Engram stats "
                                       "line is in the log tail", node=r.node, expected=expected)
        return check(ROW, False, node=r.node, expected=expected, data=data,
                     observed="the rank said nothing about its Engram tables (no 'File-backed Engram' line)",
                     fix=_fix(profile, files, why="the recipe's file-backed Engram did not report (its patch "
                                                  "did not run, or the rank's log was cut)"))
    unpacked = sorted(a.layer for a in attached.values() if not a.packed)
    if not attached:                    # a reused server: only the periodic stats lines are left
        unpacked = sorted(s.layer for s in report.stats.values() if not s.packed)
    said = [a.line for a in attached.values()] or [s.line for s in report.stats.values()]
    if unpacked:
        missing = [f for f in files if any(f"engram-l{layer}-" in f for layer in unpacked)]
        given = r.env.get("DSV41_PACKED_DIR")
        why = ("the packed file was not found where the rank looked (DSV41_PACKED_DIR=" + given + ")" if given else
               "no packed file was mounted: the rank's L1 file was missing on the node when the launch was "
               "rendered (seed A mounts ENGRAM_PACKED_DIR only where it exists)")
        return check(ROW, False, node=r.node, observed="packed=False (checkpoint reads): " + " | ".join(said[:4]),
                     expected=expected, data=data, fix=_fix(profile, missing, why=why))
    return check(ROW, True, node=r.node, observed=" | ".join(said[:4]), expected=expected, data=data)


def attach_checks(profile, plan, logs: dict[str, str], *, reused: bool = False) -> list[Check]:
    """One ``engram attached`` row per rank from its boot log (``logs``: node -> log text)."""
    if not profile.engram:
        return [not_applicable(ROW, "ENGRAM=0: no Engram tables served", node=r.node) for r in plan.ranks]
    if not serves_packed_engram(profile):
        return [not_applicable(ROW, f"recipe {profile.recipe} serves no packed Engram shards", node=r.node)
                for r in plan.ranks]
    return [_rank_row(profile, r, logs.get(r.node, ""), reused=reused) for r in plan.ranks]
