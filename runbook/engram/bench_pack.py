"""Benchmark: pack throughput vs a plain sequential copy of the same source bytes, same disk.

    python -m runbook.engram.bench_pack [--table-gib 2.2] [--repeats 3] [--workdir DIR] [--keep]

1. synthesise one V4.1-style layer table (``--table-gib``, default 2.2 GiB, layer 1 only);
2. ``--repeats`` rounds, each timing, in this order: ``dd bs=64M conv=fsync`` of the shard, ``cp`` +
   ``sync FILE`` of the shard, and ``pack.py --tp 1 --rank 0 --layers 1`` (the whole table: the same
   bytes as the copy) run as a subprocess with the system python3, exactly as on a node, once with
   ``--no-direct`` (buffered writes, for comparison) and once as shipped (O_DIRECT writes). Before each
   timed command the previous output is deleted, ``sync`` runs (so one command's writeback or discard
   is not billed to the next) and the shard is dropped from the page cache (fsync + POSIX_FADV_DONTNEED
   on that file only, so other users of the box are not disturbed);
3. the figures are medians over the rounds (every sample is printed too); the baseline is the faster
   of the two copies' medians, which is the conservative choice;
4. ``check.py`` (1024 sampled rows) and ``probe.py`` (QD 1 and 64, 5 s each) on the packed file;
5. delete everything (unless ``--keep``) and print one JSON line.

Goals (issue "Engram step 03_engram"): pack MB/s >= 0.9 x copy MB/s; packer peak RSS <= 1 GiB.
A virtual disk's speed can swing 2x between two copies a minute apart: read the samples, not just
the ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ..engram_tools import layout as L
from ..engram_tools import synth
from ..engram_tools.ship import TOOL_FILES

HERE = Path(__file__).resolve().parent


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.monotonic() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return dt, proc


def last_json(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table-gib", type=float, default=2.2)
    p.add_argument("--workdir", default=f"/tmp/engram-bench-{os.getpid()}")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds of dd, cp and pack")
    p.add_argument("--probe-seconds", type=float, default=5.0)
    p.add_argument("--python", default=shutil.which("python3") or sys.executable)
    p.add_argument("--keep", action="store_true")
    a = p.parse_args(argv)
    work = Path(a.workdir)
    src, out, tools = work / "src", work / "packed", work / "tools"
    result: dict = {"table_gib": a.table_gib, "workdir": str(work)}
    try:
        tools.mkdir(parents=True, exist_ok=True)
        for name in TOOL_FILES:             # the shipped set, as on a node
            shutil.copy(HERE / name, tools / name)
        t0 = time.monotonic()
        vocab = synth.vocab_for_table_bytes(int(a.table_gib * (1 << 30)))
        synth.make_source(str(src), vocab_size=vocab, write_layers=[1])
        shard = src / synth.shard_name(47)
        result["synth_seconds"] = round(time.monotonic() - t0, 1)
        lay = L.EngramLayout.from_config(L.load_config(str(src)), 1)
        table_bytes = lay.num_rows(1) * lay.row_bytes
        shard_bytes = shard.stat().st_size
        result.update(vocab=vocab, rows=lay.num_rows(1), table_bytes=table_bytes, shard_bytes=shard_bytes)

        packed = out / L.packed_name(1, 0, 1)
        copy_dd, copy_cp = work / "copy.dd", work / "copy.cp"
        pack_cmd = [a.python, str(tools / "pack.py"), "--src", str(src), "--out", str(out),
                    "--tp", "1", "--rank", "0", "--layers", "1", "--progress-every", "0"]
        commands = {
            "dd": ["dd", f"if={shard}", f"of={copy_dd}", "bs=64M", "conv=fsync", "status=none"],
            "cp": ["bash", "-c", f"cp {shard} {copy_cp} && sync {copy_cp}"],
            "pack_buffered": pack_cmd + ["--no-direct"],
            "pack": pack_cmd,
        }
        samples: dict[str, list[float]] = {name: [] for name in commands}
        summaries = []
        for _ in range(max(1, a.repeats)):
            for name, cmd in commands.items():
                for leftover in (copy_dd, copy_cp):
                    leftover.unlink(missing_ok=True)
                shutil.rmtree(out, ignore_errors=True)
                subprocess.run(["sync"], check=False)
                evict(shard)
                dt, proc = timed(cmd)
                samples[name].append(dt)
                if name == "pack":
                    summaries.append(last_json(proc.stdout))
        pack_bytes = packed.stat().st_size
        for leftover in (copy_dd, copy_cp):
            leftover.unlink(missing_ok=True)
        med = {name: statistics.median(v) for name, v in samples.items()}
        result["samples_seconds"] = {name: [round(x, 2) for x in v] for name, v in samples.items()}
        result["repeats"] = len(samples["pack"])
        result["dd_seconds"], result["dd_mb_s"] = round(med["dd"], 2), round(shard_bytes / med["dd"] / 1e6, 1)
        result["cp_seconds"], result["cp_mb_s"] = round(med["cp"], 2), round(shard_bytes / med["cp"] / 1e6, 1)
        copy_mb_s = max(result["dd_mb_s"], result["cp_mb_s"])
        pack_mb_s = pack_bytes / med["pack"] / 1e6
        summary = summaries[-1]
        result.update(pack_wall_seconds=round(med["pack"], 2), pack_mb_s=round(pack_mb_s, 1),
                      pack_internal_mb_s=summary.get("mb_s"),
                      pack_peak_rss_mib=round(max(x.get("peak_rss_bytes", 0) for x in summaries) / 2 ** 20, 1),
                      pack_chunk_rows=summary.get("chunk_rows"),
                      pack_vs_copy=round(pack_mb_s / copy_mb_s, 3),
                      pack_direct_bytes=sum(f.get("direct_bytes", 0) for f in summary.get("files", [])),
                      pack_buffered_mb_s=round(pack_bytes / med["pack_buffered"] / 1e6, 1))
        result["goal_ratio_ok"] = result["pack_vs_copy"] >= 0.9
        result["goal_rss_ok"] = result["pack_peak_rss_mib"] <= 1024

        _, proc = timed([a.python, str(tools / "check.py"), "--src", str(src), "--packed", str(out),
                         "--tp", "1", "--rank", "0", "--layers", "1", "--samples", "1024"])
        chk = last_json(proc.stdout)
        result["check_ok"] = chk.get("ok")
        result["check_rows"] = sum(f["rows_checked"] for f in chk.get("files", []))

        _, proc = timed([a.python, str(tools / "probe.py"), "--file", str(packed), "--qd", "1,64",
                         "--seconds", str(a.probe_seconds)])
        pr = last_json(proc.stdout)
        result["probe_mode"] = pr.get("mode")
        result["probe"] = {f"qd{r['qd']}": {"iops": r["iops"], **r["lat_us"]} for r in pr.get("results", [])}
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, sort_keys=True))
    return 0 if result.get("check_ok") else 1


if __name__ == "__main__":
    raise SystemExit(main())
