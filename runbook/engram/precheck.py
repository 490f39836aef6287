"""Before packing, from the facts: the source rows (python3, the source files, the worker's parity with
the head, the size against ENGRAM_GIB) and the free-space row (bytes each rank still has to write).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..checks import Check, CheckList, Status, check, not_applicable
from ..engram_tools import layout as L
from ..engram_tools.layout import engram_shards
from .facts import config_of
from ..engram_tools.pack_partial import ALIGN_ROWS, recorded_rows
from ..engram_tools.ship import node_facts, packed_of

GIB, MIB = 1 << 30, 1 << 20
SOURCE_FIX = ("run the weights step (02_weights) so ENGRAM_SRC_DIR holds config.json, "
              "model.safetensors.index.json and the shards with layers.{1,14}.engram.embed.* "
              "(HF_ENGRAM_REPO shards 47/48); on the worker ENGRAM_SRC_DIR must show the head's files")


def source_checks(profile, facts: Mapping[str, Any]) -> list[Check]:
    """Per packing node: python3 usable; ENGRAM_SRC_DIR holds config.json, index and the Engram
    shards; the worker sees the same shard sizes as the head; the total matches ENGRAM_GIB."""
    out: list[Check] = []
    head_sizes: dict[str, int] | None = None
    for name, nf in sorted(facts.items(), key=lambda kv: kv[1].get("rank", 99)):
        if not profile.holds_rank(nf.get("rank", 0)):
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
        shards = engram_shards(nf.get("index"), nf.get("src_files", {}))
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
            if profile.engram_gib > 0:
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


def expected_files(profile, config: Mapping[str, Any], layers=None) -> dict[str, list[L.RankRange]]:
    """Per node: the rank ranges (and so exact file sizes) the packer must produce."""
    layout = L.EngramLayout.from_config(config, int(profile.tp))
    wanted = list(layers) if layers else list(layout.layer_ids)
    out: dict[str, list[L.RankRange]] = {}
    for spec in profile.nodes:
        if profile.holds_rank(spec.rank):     # every stage: a stage-1 node packs its stage-0 twin's ranges
            out[spec.name] = [layout.rank_range(layer, profile.tp_rank(spec.rank)) for layer in wanted]
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
        rows = recorded_rows(record, r, int(existing.get(r.file_name + ".partial", 0)))
        if rows and shard_sizes is not None and any(
                shard_sizes.get((record.get(k) or {}).get("shard")) != (record.get(k) or {}).get("size")
                for k in ("weight", "scale")):
            rows = 0
        if rows < r.rows:
            rows -= rows % ALIGN_ROWS            # the packer restarts on a 512-row boundary
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
        nf = node_facts(facts, name)
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
        packed = packed_of(profile, nf)
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
