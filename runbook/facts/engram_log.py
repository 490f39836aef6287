"""What a serving rank says about its Engram tables in its boot log (pure; step 04 reads the log, this parses it).

Recipe A's file-backed Engram (``overlay/engram_file_backend.py`` + ``overlay/row_store.cpp``; repo A does not
publish them, read from the fork Englishtartar2028/DeepSeek-v4.1-Flash-EXL3-2x-DGX-Sparks @ e2944b3, whose
``engram_file_backend.py`` body is the one vendored elsewhere from repo A @ 979e68a "unchanged") prints, per
rank and Engram layer, while the model is built::

    File-backed Engram layer=1 rank=0/2 rows=[0,192001740) cache=0.0GiB packed=True
        engram_file_backend.py:361-367 (print, stdout: always in the rank's log); the same fields with
        ``scales=…GiB packed=… (not pinned 47GiB UVA)`` at :350-360 (logger.info, shown only where the
        ``dsv41.engram_file`` logger is configured). ``packed`` is ``row_store_attach_packed``'s answer.
    Engram: packed shard /engram-packed/engram-l1-r0of2.bin does not match this rank (layer=1 lo=0 hi=192001740); ignoring, using checkpoint
        row_store.cpp:399-407 (stderr): the file exists but its header (magic, layer, lo, hi, rows, 264) is not
        this rank's; the rank serves from the checkpoint (two reads per miss, over NFS on a worker).
    Engram retrieval failed: packed Engram shard has no header (errno=0)
        row_store.cpp:84 via :391 (no header) / :414 (truncated): the rank aborts.
    Engram: O_DIRECT unavailable for /engram-src/model-00047-of-00048.safetensors, using buffered reads (errno was 22)
        row_store.cpp:325-327 (the checkpoint on NFS: a note, not a fallback).
    Engram layer=1 lookups=4096 hit_rate=0.0% reads=4096 cache=0.0GiB packed=True
        engram_file_backend.py:142-150 (logger.info every DSV41_STATS_SECONDS with lookups; same logger caveat).

No line for a layer at all means the file backend did not run there (``patch_engram_file.py`` not applied) or the
rank died before its model was built. A missing packed file prints only ``packed=False``: the backend opens it only
``if shard.is_file()`` (engram_file_backend.py:301-313), and seed A mounts the packed dir only where the rank's L1
file exists. The lab recipe's stand-in (``runbook/lab/recipe/overlay/engram_standin.py``) prints the same lines.

    report = parse_engram_log(text) -> EngramReport
    report.layers   {(layer, rank): LayerAttach}   the "File-backed Engram" lines (last one per layer and rank)
    report.ignored  [IgnoredShard]                 the "does not match this rank" lines
    report.stats    {layer: StatsLine}             the last periodic stats line per layer
    report.aborts   [str]                          "Engram retrieval failed" reasons
    report.buffered [str]                          checkpoint paths read without O_DIRECT
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "EngramReport",
    "IgnoredShard",
    "LayerAttach",
    "StatsLine",
    "parse_engram_log",
]

_LOADED = re.compile(r"File-backed Engram layer=(\d+) rank=(\d+)/(\d+) rows=\[(\d+),(\d+)\) "
                     r"cache=([\d.]+)GiB (?:scales=([\d.]+)GiB )?packed=(True|False)")
_IGNORED = re.compile(r"Engram: packed shard (.+?) does not match this rank "
                      r"\(layer=(\d+) lo=(\d+) hi=(\d+)\); ignoring, using checkpoint")
_STATS = re.compile(r"Engram layer=(\d+) lookups=(\d+) hit_rate=([\d.]+)% reads=(\d+) "
                    r"cache=([\d.]+)GiB packed=(True|False)")
_ABORT = re.compile(r"Engram retrieval failed: (.+?) \(errno=(-?\d+)\)")
_BUFFERED = re.compile(r"Engram: O_DIRECT unavailable for (.+?), using buffered reads")


@dataclass(frozen=True)
class LayerAttach:
    layer: int
    rank: int
    tp: int
    lo: int
    hi: int
    packed: bool
    line: str


@dataclass(frozen=True)
class IgnoredShard:
    path: str
    layer: int
    lo: int
    hi: int
    line: str


@dataclass(frozen=True)
class StatsLine:
    layer: int
    lookups: int
    hit_rate: float
    reads: int
    packed: bool
    line: str


@dataclass
class EngramReport:
    layers: dict[tuple[int, int], LayerAttach] = field(default_factory=dict)
    ignored: list[IgnoredShard] = field(default_factory=list)
    stats: dict[int, StatsLine] = field(default_factory=dict)
    aborts: list[str] = field(default_factory=list)
    buffered: list[str] = field(default_factory=list)

    @property
    def said_anything(self) -> bool:
        return bool(self.layers or self.ignored or self.stats or self.aborts)

    def ignored_for(self, layer: int) -> list[IgnoredShard]:
        return [i for i in self.ignored if i.layer == layer]

    def to_dict(self) -> dict[str, Any]:
        return {"layers": [asdict(a) for a in self.layers.values()], "ignored": [asdict(i) for i in self.ignored],
                "stats": [asdict(s) for s in self.stats.values()], "aborts": list(self.aborts),
                "buffered": list(self.buffered)}


def parse_engram_log(text: str) -> EngramReport:
    """Every Engram line of one rank's log (a vLLM worker's ``(Worker pid=…)`` prefix or a timestamp in front is
    fine: the lines are searched, not matched at the start)."""
    out = EngramReport()
    for raw in (text or "").splitlines():
        if "Engram" not in raw:
            continue
        line = raw.strip()[:400]
        if m := _LOADED.search(raw):
            layer, rank, tp, lo, hi = (int(m.group(i)) for i in range(1, 6))
            out.layers[(layer, rank)] = LayerAttach(layer, rank, tp, lo, hi, m.group(8) == "True", line)
        elif m := _IGNORED.search(raw):
            out.ignored.append(IgnoredShard(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), line))
        elif m := _STATS.search(raw):
            out.stats[int(m.group(1))] = StatsLine(int(m.group(1)), int(m.group(2)), float(m.group(3)),
                                                   int(m.group(4)), m.group(6) == "True", line)
        elif m := _ABORT.search(raw):
            out.aborts.append(m.group(1))
        elif m := _BUFFERED.search(raw):
            out.buffered.append(m.group(1))
    return out
