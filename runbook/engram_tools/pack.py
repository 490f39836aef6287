#!/usr/bin/env python3
"""Pack this rank's Engram rows into ``engram-l{L}-r{rank}of{tp}.bin`` (one file per layer).

STANDALONE, STDLIB ONLY: shipped to each node together with ``layout.py``, ``pack_partial.py`` (the
``.partial`` and its progress record) and ``pack_writer.py`` (the write path), all in one directory, and
run with the node's python3::

    python3 pack.py --src ENGRAM_SRC_DIR --out PACKED_DIR --tp 2 --rank R [--layers 1,14]

What it does, per layer:

* reads ``config.json`` and checks the prime hash layout against ``engram_num_embeddings``;
* finds ``layers.{L}.engram.embed.weight`` (F8_E4M3 [N,256]) and ``.scale`` (F8_E8M0 [N,8]) via
  the safetensors index (or by scanning shard headers) and refuses, naming the tensor, on a wrong
  dtype or shape; only headers and byte ranges are read, never a whole table;
* checks free space first: only what is still to write counts (a partial's recorded rows are on
  disk already); the refusal names the directory and the bytes needed, still to write and free;
* writes ``<final>.partial`` (held under an exclusive ``flock``: a second packer on the same file
  is refused): the 4096-byte header, then rows lo..hi-1 as 256 weight bytes + 8
  scale bytes, assembled by scatter-reads (``preadv``) straight into a row-interleaved chunk buffer
  (32 MiB of page-aligned memory, a multiple of 4096 bytes so every chunk write is page aligned);
  a writer thread overlaps the writes, which go through ``O_DIRECT`` where the filesystem allows it
  (no page-cache copy; median 3.01 s against 3.44 s buffered for a 2.36 GB table), else buffered;
  ``fdatasync`` + ``POSIX_FADV_DONTNEED`` every ``--sync-mib`` behind the writes and DONTNEED
  behind the reads keep the page cache (GPU memory on GB10) flat;
* records the durable row count in ``<final>.partial.json`` after each sync (``pack_partial.Journal``: why a
  record and not the file size, and why it survives a torn write and a full disk), and once more
  when the pack stops early: disk full (ENOSPC/EDQUOT), an I/O error, or SIGTERM/SIGHUP/SIGINT
  (the chunks in hand are written first). A re-run continues from the recorded row (rounded down
  to 512 rows so O_DIRECT offsets stay page aligned) after re-reading the last recorded rows
  against the source; a SIGKILL loses at most the rows since the last sync. A partial without a
  matching record (other layout, other source shard size/mtime) is redone from row 0;
* fsyncs, checks the exact size, renames to the final name, fsyncs the directory: nothing
  half-written ever has the final name.

A complete file (matching 4096-byte header and exact size) is skipped. Output: progress lines
prefixed ``[engram-pack]`` and, last, one JSON line (``{"tool": "engram-pack", ...}``; ``space``
holds the space check's numbers, a failure carries ``rows_done``/``need_bytes``/``dir``).
Exit codes: 0 ok, 2 refused (layout/dtype/shape/config), 3 not enough disk space (before or while
writing), 4 I/O error, 5 another packer holds the partial, 128+N stopped by signal N (143: SIGTERM).
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import resource
import signal
import sys
import time

try:                                   # imported as runbook.engram_tools.pack (tests, laptop)
    from . import layout as L
    from .pack_partial import (ALIGN_ROWS, EXIT_IO, EXIT_REFUSED, EXIT_SPACE, TOOL, Journal, PackError,
                               file_is_complete, lock_partial, log, resumable_rows, source_identity)
    from .pack_writer import STOP, STOP_SIGNAL, Packer
except ImportError:                    # run as a script next to layout.py (nodes); also under
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # python3 -I / PYTHONSAFEPATH
    import layout as L  # type: ignore[no-redef]
    from pack_partial import (ALIGN_ROWS, EXIT_IO, EXIT_REFUSED, EXIT_SPACE, TOOL, Journal,  # type: ignore[no-redef]
                              PackError, file_is_complete, lock_partial, log, resumable_rows, source_identity)
    from pack_writer import STOP, STOP_SIGNAL, Packer  # type: ignore[no-redef]

MiB, GiB = 1 << 20, 1 << 30


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # ru_maxrss is KiB on Linux


# -- main ----------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description="Pack Engram rows for one TP rank (stdlib only).")
    p.add_argument("--src", required=True, help="dir with config.json, the index and shards 47/48")
    p.add_argument("--out", required=True, help="output dir on node-local disk")
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--dp-rank", type=int, default=0)
    p.add_argument("--layers", default="", help="comma-separated layer ids (default: all Engram layers)")
    p.add_argument("--config", default=None, help="config.json (default: SRC/config.json)")
    p.add_argument("--chunk-mib", type=int, default=32)
    p.add_argument("--chunk-rows", type=int, default=0, help="overrides --chunk-mib; multiple of 512")
    p.add_argument("--sync-mib", type=int, default=256, help="fdatasync + drop cache every N MiB")
    p.add_argument("--no-direct", dest="direct", action="store_false",
                   help="buffered writes only (default: O_DIRECT where the filesystem allows it)")
    p.add_argument("--progress-every", type=int, default=16, help="progress line every N chunks (0: off)")
    p.add_argument("--skip-space-check", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--stop-after-chunks", type=int, default=0, help=argparse.SUPPRESS)  # test hook
    a = p.parse_args(argv)
    if a.chunk_rows and a.chunk_rows % ALIGN_ROWS:
        p.error(f"--chunk-rows must be a multiple of {ALIGN_ROWS}")
    if a.chunk_mib < 1:
        p.error("--chunk-mib must be >= 1")
    return a


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _plan(args, layout, layers, locs, locks: dict) -> list[dict]:
    """Per layer: what to do and from which row. Existing partials are locked first (``locks``:
    final path -> fd, handed to ``Packer.pack``) so their record cannot change while we read it."""
    plans = []
    for layer in layers:
        rr = layout.rank_range(layer, args.rank, args.dp_rank)
        final = os.path.join(args.out, rr.file_name)
        partial = final + ".partial"
        wloc, sloc = locs[L.weight_name(layer)], locs[L.scale_name(layer)]
        expect = {"layer": rr.layer, "lo": rr.lo, "hi": rr.hi, "total_rows": rr.total_rows,
                  "row_bytes": rr.row_bytes, "weight": source_identity(wloc), "scale": source_identity(sloc)}
        journal = Journal(partial + ".json", expect)
        start = 0
        if file_is_complete(final, rr):
            status, start = "skipped", rr.rows
            if os.path.exists(partial):
                os.close(lock_partial(partial))          # not while another packer writes it
                os.unlink(partial)
            journal.remove()
        else:
            if os.path.exists(partial):
                locks[final] = fd = lock_partial(partial)
                start = resumable_rows(fd, journal.path, expect, rr, wloc, sloc)
                if not start:
                    log(f"{os.path.basename(partial)}: no valid progress record; redoing it from row 0")
            status = "resumed" if start else ("replaced" if os.path.exists(final) else "packed")
        kept = L.HEADER_BYTES + start * rr.row_bytes if start else 0
        plans.append({"rr": rr, "final": final, "wloc": wloc, "sloc": sloc, "journal": journal,
                      "status": status, "start": start, "kept": kept,
                      "need": 0 if status == "skipped" else rr.packed_bytes - kept + journal.missing_bytes()})
    return plans


def run(args) -> dict:
    cfg = L.load_config(args.src, args.config)
    layout = L.EngramLayout.from_config(cfg, args.tp, args.dp)
    layers = [int(x) for x in args.layers.split(",") if x.strip()] if args.layers else list(layout.layer_ids)
    for layer in layers:
        layout.layer_index(layer)
    names = [n for layer in layers for n in (L.weight_name(layer), L.scale_name(layer))]
    locs = L.locate_tensors(args.src, names)
    for layer in layers:
        L.validate_tables(layout, layer, locs[L.weight_name(layer)], locs[L.scale_name(layer)])
    os.makedirs(args.out, exist_ok=True)
    packer = Packer(args, layout)
    biggest = max(layout.rank_range(l, args.rank, args.dp_rank).rows for l in layers)
    packer.chunk_rows = max(ALIGN_ROWS, min(packer.chunk_rows, -(-biggest // ALIGN_ROWS) * ALIGN_ROWS))
    locks: dict[str, int] = {}
    try:
        return _run(args, layout, layers, locs, packer, locks)
    finally:
        for fd in locks.values():                       # the ones no pack() took over
            os.close(fd)


def _run(args, layout, layers, locs, packer: Packer, locks: dict) -> dict:
    plans = _plan(args, layout, layers, locs, locks)
    # Space: only what is still to write counts; rows a partial keeps (its record) are on disk already.
    todo = [p for p in plans if p["status"] != "skipped"]
    need = sum(p["need"] for p in todo)
    kept = sum(p["kept"] for p in todo)
    total = sum(p["rr"].packed_bytes for p in todo)
    free = _free_bytes(args.out)
    space = {"dir": os.path.abspath(args.out), "need_bytes": need, "free_bytes": free,
             "kept_bytes": kept, "total_bytes": total}
    if need > free and not args.skip_space_check:
        kept_text = f"; {kept} bytes of it are in .partial files already and resume" if kept else ""
        raise PackError(f"not enough free space in {space['dir']}: need {need} bytes ({need / GiB:.2f} GiB) "
                        f"still to write of {total} bytes ({total / GiB:.2f} GiB){kept_text}; free {free} bytes "
                        f"({free / GiB:.2f} GiB)", EXIT_SPACE, space)
    log(f"layout ok: tp={args.tp} rank={args.rank} layers={layers} chunk={packer.chunk_rows} rows "
        f"({packer.chunk_rows * packer.row_bytes / MiB:.1f} MiB); to write {need / GiB:.3f} GiB"
        f"{f' ({kept / GiB:.3f} GiB kept in .partial files)' if kept else ''}, free {free / GiB:.3f} GiB "
        f"in {space['dir']}")

    files, total_bytes, t0 = [], 0, time.monotonic()
    for k, p in enumerate(plans):
        rr, final, status, start = p["rr"], p["final"], p["status"], p["start"]
        entry = {"layer": rr.layer, "path": final, "lo": rr.lo, "hi": rr.hi, "rows": rr.rows,
                 "columns": [rr.col_lo, rr.col_hi], "bytes": rr.packed_bytes, "status": status,
                 "resumed_from_row": start if status == "resumed" else 0}
        if status == "skipped":
            log(f"{rr.file_name}: complete (header and size match), skipped")
            entry.update(seconds=0.0, bytes_written=0, direct_bytes=0, mb_s=0.0)
            files.append(entry)
            continue
        if STOP.is_set():
            raise PackError(f"stopped by {signal.Signals(STOP_SIGNAL[0]).name} before {rr.file_name}; "
                            "re-run to continue", 128 + STOP_SIGNAL[0])
        if start:
            log(f"{rr.file_name}: resuming at row {start} of {rr.rows} "
                f"({(rr.rows - start) * rr.row_bytes / GiB:.3f} GiB left)")
        else:
            log(f"{rr.file_name}: packing rows [{rr.lo}, {rr.hi}) ({rr.packed_bytes / GiB:.2f} GiB)")
        try:
            res = packer.pack(rr, p["wloc"], p["sloc"], final, start, p["journal"], locks.pop(final, None))
        except (OSError, PackError) as exc:
            raise _interrupted(exc, args, p, plans[k + 1:]) from None
        entry.update(seconds=round(res["seconds"], 3), bytes_written=res["bytes_written"],
                     direct_bytes=res["direct_bytes"],
                     mb_s=round(res["bytes_written"] / max(res["seconds"], 1e-9) / 1e6, 1))
        total_bytes += res["bytes_written"]
        log(f"{rr.file_name}: done, {entry['mb_s']} MB/s")
        files.append(entry)
    secs = time.monotonic() - t0
    return {"tool": TOOL, "ok": True, "tp": args.tp, "rank": args.rank, "layers": layers,
            "files": files, "bytes_written": total_bytes, "seconds": round(secs, 3),
            "mb_s": round(total_bytes / max(secs, 1e-9) / 1e6, 1), "space": space,
            "chunk_rows": packer.chunk_rows, "peak_rss_bytes": peak_rss_bytes()}


def _interrupted(exc: Exception, args, plan: dict, later: list[dict]) -> PackError:
    """The error for a pack that stopped mid-file: what is kept, and (disk full) what is still
    needed and where."""
    rr, partial = plan["rr"], plan["final"] + ".partial"
    rows = plan["journal"].rows or 0
    kept = L.HEADER_BYTES + rows * rr.row_bytes if rows else 0
    left = rr.packed_bytes - kept + sum(p["need"] for p in later if p["status"] != "skipped")
    details = {"partial": partial, "rows_done": rows, "rows": rr.rows, "kept_bytes": kept,
               "dir": os.path.abspath(args.out), "need_bytes": left}
    kept_text = (f"{rows} of {rr.rows} rows are kept in {os.path.basename(partial)} and a re-run resumes "
                 f"from row {rows}" if rows else f"no rows of {os.path.basename(partial)} are recorded yet")
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        free = _free_bytes(args.out)
        details["free_bytes"] = free
        return PackError(f"disk full while writing {partial}: {kept_text}; {left} bytes ({left / GiB:.3f} GiB) "
                         f"still to write in {details['dir']}, {free} bytes free now: free space or grow "
                         "the filesystem, then re-run", EXIT_SPACE, details)
    if isinstance(exc, PackError):
        if exc.code < 128:                          # refused/busy: nothing about progress to add
            return exc
        return PackError(f"{exc} while writing {partial}: {kept_text}", exc.code, details)
    return PackError(f"I/O error while packing {plan['final']}: {exc}; {kept_text}", EXIT_IO, details)


def _on_stop_signal(signum, _frame) -> None:
    STOP_SIGNAL[0] = signum
    STOP.set()


def main(argv=None) -> int:
    args = parse_args(argv)
    STOP.clear()
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # stop at a chunk edge, record, exit
        try:
            previous[sig] = signal.signal(sig, _on_stop_signal)
        except (ValueError, OSError):                          # not the main thread (in-process use)
            pass
    details: dict = {}
    try:
        summary = run(args)
        code = 0
    except PackError as exc:
        summary, code, details = {"error": str(exc)}, exc.code, exc.details
    except L.LayoutError as exc:
        summary, code = {"error": str(exc)}, EXIT_REFUSED
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            summary, code = {"error": f"disk full: {exc}"}, EXIT_SPACE
        else:
            summary, code = {"error": f"I/O error: {exc}"}, EXIT_IO
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code:
        print(f"[{TOOL}] ERROR: {summary['error']}", file=sys.stderr, flush=True)
        summary = {**details, "tool": TOOL, "ok": False, "exit_code": code, "tp": args.tp, "rank": args.rank,
                   "error": summary["error"], "peak_rss_bytes": peak_rss_bytes()}
    print(json.dumps(summary, sort_keys=True), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
