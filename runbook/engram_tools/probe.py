#!/usr/bin/env python3
"""Random-row read probe on a packed Engram file (what a serving-time cache miss costs).

STANDALONE, STDLIB ONLY (shipped next to ``layout.py``)::

    python3 probe.py --file PACKED.bin [--qd 1,64] [--seconds 5] [--mode auto|direct|buffered]

For each queue depth, that many threads issue random one-row reads (``os.pread``/``os.preadv``)
for ``--seconds`` (bounded also by ``--max-ops``) and the probe reports IOPS and latency
percentiles. ``direct`` opens the file with ``O_DIRECT`` (like the serving row store) and reads
the 4 KiB-aligned span covering the 264-byte row (4 or 8 KiB); ``buffered`` reads the 264 bytes
through the page cache after dropping the file's cached pages (on a warm cache it measures
memory, not the disk). ``auto`` = direct, falling back to buffered where the filesystem refuses
O_DIRECT (NFS, tmpfs), with a note. Python threads release the GIL in pread, but at high queue
depth the interpreter overhead caps IOPS: treat QD=64 figures as a lower bound.
One JSON line on stdout.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import sys
import threading
import time

try:
    from . import layout as L
except ImportError:                    # run as a script next to layout.py (nodes); also under
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # python3 -I / PYTHONSAFEPATH
    import layout as L  # type: ignore[no-redef]

TOOL = "engram-probe"
ALIGN = 4096


def percentile(sorted_values: list[int], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, int(round(q / 100.0 * (len(sorted_values) - 1)))))
    return sorted_values[k] / 1000.0          # ns -> us


def open_file(path: str, mode: str) -> tuple[int, str, str]:
    note = ""
    if mode in ("auto", "direct") and hasattr(os, "O_DIRECT"):
        fd = None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            buf = mmap.mmap(-1, 2 * ALIGN)
            os.preadv(fd, [memoryview(buf)[:ALIGN]], 0)       # some FS accept the flag, fail the read
            buf.close()
            return fd, "direct", note
        except OSError as exc:
            if mode == "direct":
                raise
            note = f"O_DIRECT refused ({exc.strerror}); buffered reads through the page cache"
            if fd is not None:            # the open itself may be what failed
                try:
                    os.close(fd)
                except OSError:
                    pass
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    except (AttributeError, OSError):
        pass
    return fd, "buffered", note


def run_qd(fd: int, mode: str, rows: int, row_bytes: int, qd: int, seconds: float, max_ops: int,
           seed: int) -> dict:
    deadline = time.monotonic() + seconds
    lat: list[list[int]] = [[] for _ in range(qd)]
    errors: list[str] = []
    counter = {"ops": 0}
    lock = threading.Lock()
    per_thread_cap = max(1, max_ops // qd) if max_ops else 0
    start_evt = threading.Event()

    def worker(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        mine = lat[i]
        buf = mmap.mmap(-1, 2 * ALIGN) if mode == "direct" else None
        mv = memoryview(buf) if buf is not None else None
        start_evt.wait()
        perf = time.perf_counter_ns
        try:
            while time.monotonic() < deadline and (not per_thread_cap or len(mine) < per_thread_cap):
                r = rng.randrange(rows)
                off = L.HEADER_BYTES + r * row_bytes
                t0 = perf()
                if mv is not None:
                    a = off - off % ALIGN
                    span = -(-(off + row_bytes - a) // ALIGN) * ALIGN
                    n = os.preadv(fd, [mv[:span]], a)
                    ok = n >= off + row_bytes - a
                else:
                    ok = len(os.pread(fd, row_bytes, off)) == row_bytes
                mine.append(perf() - t0)
                if not ok:
                    raise OSError(f"short read at row {r}")
        except OSError as exc:
            with lock:
                errors.append(str(exc))
        finally:
            if mv is not None:
                mv.release()
                buf.close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(qd)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    deadline = t0 + seconds
    start_evt.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    all_lat = sorted(x for part in lat for x in part)
    counter["ops"] = len(all_lat)
    return {"qd": qd, "seconds": round(elapsed, 3), "ops": counter["ops"],
            "iops": round(counter["ops"] / max(elapsed, 1e-9), 1),
            "lat_us": {"mean": round(sum(all_lat) / max(len(all_lat), 1) / 1000.0, 1),
                       "p50": round(percentile(all_lat, 50), 1), "p90": round(percentile(all_lat, 90), 1),
                       "p99": round(percentile(all_lat, 99), 1), "p999": round(percentile(all_lat, 99.9), 1),
                       "max": round(all_lat[-1] / 1000.0, 1) if all_lat else 0.0},
            "errors": errors[:4]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Random 264-byte row reads on a packed Engram file.")
    p.add_argument("--file", required=True)
    p.add_argument("--qd", default="1,64", help="comma-separated queue depths (threads)")
    p.add_argument("--seconds", type=float, default=5.0, help="per queue depth (hard bound)")
    p.add_argument("--max-ops", type=int, default=2_000_000, help="per queue depth (0: unbounded)")
    p.add_argument("--mode", choices=("auto", "direct", "buffered"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    try:
        with open(a.file, "rb") as f:
            hdr = L.parse_header(f.read(L.HEADER_BYTES))
        if hdr["magic"] != L.MAGIC:
            raise L.LayoutError(f"{a.file}: bad magic {hdr['magic']:#x}, expected {L.MAGIC:#x}")
        rows, row_bytes = hdr["hi"] - hdr["lo"], hdr["row_bytes"]
        size = os.path.getsize(a.file)
        if rows <= 0 or size < L.HEADER_BYTES + rows * row_bytes:
            raise L.LayoutError(f"{a.file}: {size} bytes is short for {rows} rows of {row_bytes}")
        fd, mode, note = open_file(a.file, a.mode)
        try:
            results = [run_qd(fd, mode, rows, row_bytes, int(q), a.seconds, a.max_ops, a.seed)
                       for q in a.qd.split(",") if q.strip()]
        finally:
            os.close(fd)
        out = {"tool": TOOL, "ok": all(not r["errors"] for r in results), "file": a.file, "rows": rows,
               "row_bytes": row_bytes, "mode": mode, "note": note, "results": results}
        code = 0 if out["ok"] else 1
    except (L.LayoutError, OSError) as exc:
        out, code = {"tool": TOOL, "ok": False, "file": a.file, "error": str(exc)}, 2
    print(json.dumps(out, sort_keys=True), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
