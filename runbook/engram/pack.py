#!/usr/bin/env python3
"""Pack this rank's Engram rows into ``engram-l{L}-r{rank}of{tp}.bin`` (one file per layer).

STANDALONE, STDLIB ONLY: shipped to each node together with ``layout.py`` (same directory) and
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
* records the durable row count in ``<final>.partial.json`` after each sync (``Journal``: why a
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
import fcntl
import json
import mmap
import os
import queue
import resource
import signal
import sys
import threading
import time

try:                                   # imported as runbook.engram.pack (tests, laptop)
    from . import layout as L
except ImportError:                    # run as a script next to layout.py (nodes); also under
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # python3 -I / PYTHONSAFEPATH
    import layout as L  # type: ignore[no-redef]

TOOL = "engram-pack"
EXIT_REFUSED, EXIT_SPACE, EXIT_IO, EXIT_BUSY, EXIT_TEST_STOP = 2, 3, 4, 5, 75   # a stop signal: 128 + signum
RECORD_BYTES = 4096                    # a progress record is one page, rewritten in place
IOV_GROUP = 1024                       # <= IOV_MAX (1024 on Linux)
DIRECT_ALIGN = 4096                    # O_DIRECT offset/length alignment we keep to (page size)
N_BUFFERS = 3                          # one being read, one being written, one spare
ALIGN_ROWS = 512                       # 512 rows * 264 B = 33 pages: chunk writes stay page aligned
MiB, GiB = 1 << 20, 1 << 30
STOP = threading.Event()               # set by SIGTERM/SIGHUP/SIGINT: finish the chunk in hand, record, exit
STOP_SIGNAL = [0]


class PackError(Exception):
    def __init__(self, message: str, code: int, details: dict | None = None):
        super().__init__(message)
        self.code = code
        self.details = details or {}     # extra keys for the JSON summary (space, kept rows)


def log(msg: str) -> None:
    print(f"[{TOOL}] {msg}", flush=True)


def _fadvise(fd: int, offset: int, length: int, advice: int) -> None:
    try:
        os.posix_fadvise(fd, offset, length, advice)
    except (AttributeError, OSError):  # not fatal: only a page-cache hint
        pass


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # ru_maxrss is KiB on Linux


# -- chunk buffers -------------------------------------------------------------------------

class ChunkBuffer:
    """A row-interleaved chunk buffer. Weight rows are scatter-read (``preadv``) straight into
    their row slots through precomputed views; the scale column (8 bytes = one u64 per row when
    head_dim is 256) is read contiguously and placed with one strided u64 copy."""

    def __init__(self, rows: int, head: int, tail: int):
        self.rows, self.head, self.tail = rows, head, tail
        rb = head + tail
        self.data = mmap.mmap(-1, rows * rb)    # page aligned, as O_DIRECT writes need
        self.mv = memoryview(self.data)
        self.words = rb % 8 == 0 and tail % 8 == 0 and head % 8 == 0
        w = [self.mv[i * rb:i * rb + head] for i in range(rows)]
        self.wgroups = [w[i:i + IOV_GROUP] for i in range(0, rows, IOV_GROUP)]
        if self.words:                   # fast path (V4.1): one strided copy for the scales
            self.scale_buf = bytearray(rows * tail)
            self.scale_mv = memoryview(self.scale_buf)
            self.out_q = self.mv.cast("Q")
            self.scale_q = self.scale_mv.cast("Q")
        else:                            # generic: scatter-read scales too
            s = [self.mv[i * rb + head:(i + 1) * rb] for i in range(rows)]
            self.sgroups = [s[i:i + IOV_GROUP] for i in range(0, rows, IOV_GROUP)]

    def groups(self, n: int, which: str) -> list[list[memoryview]]:
        full = self.wgroups if which == "w" else self.sgroups
        if n == self.rows:
            return full
        k, rem = divmod(n, IOV_GROUP)
        out = full[:k]
        if rem:
            out = out + [full[k][:rem]]
        return out

    def read_scales(self, fd: int, n: int, offset: int, what: str) -> None:
        if not self.words:
            scatter_read(fd, self.groups(n, "s"), self.tail, offset, what)
            return
        want = n * self.tail
        got = 0
        while got < want:
            r = os.preadv(fd, [self.scale_mv[got:want]], offset + got)
            if r <= 0:
                raise PackError(f"short read from {what} at byte {offset + got}: source truncated?", EXIT_IO)
            got += r
        rb_q, head_q, tail_q = (self.head + self.tail) // 8, self.head // 8, self.tail // 8
        for k in range(tail_q):
            self.out_q[head_q + k:n * rb_q:rb_q] = self.scale_q[k:n * tail_q:tail_q]


def open_direct(path: str) -> int | None:
    """A second descriptor on ``path`` with O_DIRECT, or None where the filesystem refuses it
    (tmpfs on older kernels, some network filesystems) or the platform has no O_DIRECT."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | flag | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None


def write_all(fd: int, view: memoryview, off: int) -> None:
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], off + done)


def scatter_read(fd: int, groups: list[list[memoryview]], unit: int, offset: int, what: str) -> None:
    """Read ``unit`` bytes per view, contiguously from ``offset``, into the views of ``groups``."""
    pos = offset
    for g in groups:
        want = len(g) * unit
        n = os.preadv(fd, g, pos)
        while n < want:                 # short read: finish view by view, EOF means truncated
            i, k = divmod(n, unit)
            r = os.preadv(fd, [g[i][k:]], pos + n)
            if r <= 0:
                raise PackError(f"short read from {what} at byte {pos + n}: source truncated?", EXIT_IO)
            n += r
        pos += want


# -- state of one output file -----------------------------------------------------------------

def source_identity(loc: L.TensorLoc) -> dict:
    st = os.stat(loc.path)
    return {"shard": os.path.basename(loc.path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "offset": loc.offset, "nbytes": loc.nbytes}


def file_is_complete(path: str, rr: L.RankRange) -> bool:
    try:
        if os.path.getsize(path) != rr.packed_bytes:
            return False
        with open(path, "rb") as f:
            return f.read(L.HEADER_BYTES) == rr.header()
    except OSError:
        return False


class Journal:
    """The durable progress of one ``.partial``: ``<partial>.json``, one JSON line (the layout and
    source identity, and ``rows_done``) padded with spaces to RECORD_BYTES.

    Why a record rather than the partial's size: the size says what was written, not what is on
    disk. After a kill the tail may never have been synced, and after a power loss the size can
    reach the disk before the data (the tail reads back as zeros). The record is written only after
    ``fdatasync`` of the rows it counts, so it never claims more than is durable.

    Why it survives a torn write and a full disk: a new record is written into ``<partial>.json.next``,
    fsynced, then renamed over ``.json``. A torn write can only hit ``.next``, which is never read,
    so ``.json`` is always the old record or the new one. ``.next`` is preallocated (RECORD_BYTES,
    fsynced) right after each rename and then overwritten in place, so the last record after ENOSPC
    needs no new block (a plain create-and-rename would fail on the full disk)."""

    def __init__(self, path: str, expect: dict):
        self.path, self.next = path, path + ".next"
        self.expect = expect
        self.rows: int | None = None         # rows_done of the last record this run wrote

    def write(self, rows_done: int) -> None:
        data = json.dumps({**self.expect, "rows_done": rows_done}, sort_keys=True).encode()
        if len(data) >= RECORD_BYTES:
            raise PackError(f"progress record for {self.path} is {len(data)} bytes (> {RECORD_BYTES})", EXIT_IO)
        data += b" " * (RECORD_BYTES - 1 - len(data)) + b"\n"
        fd = os.open(self.next, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)  # no O_TRUNC:
        try:                                                                # reuse its blocks
            write_all(fd, memoryview(data), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self.next, self.path)
        _fsync_dir(os.path.dirname(self.path) or ".")
        self.rows = rows_done
        self.reserve()

    def reserve(self) -> None:
        """Preallocate ``.next`` for the next record; not fatal (the disk may be full right now)."""
        try:
            fd = os.open(self.next, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError:
            return
        try:
            if os.fstat(fd).st_size != RECORD_BYTES:
                write_all(fd, memoryview(b" " * RECORD_BYTES), 0)
                os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def remove(self) -> None:
        for path in (self.path, self.next):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def missing_bytes(self) -> int:
        """Bytes the record files still have to take on disk (for the space check)."""
        return sum(RECORD_BYTES for path in (self.path, self.next) if not os.path.exists(path))


def read_record(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            rec = json.loads(f.read(RECORD_BYTES + 1))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def recorded_rows(record, rr: L.RankRange, partial_size: int) -> int:
    """Rows of a ``.partial`` that its progress record vouches for: ``rows_done`` when the record is
    for this file's layout and the partial holds at least that many rows, else 0. Pure (no source
    identity): step.py's space check uses it on what it read from a node; the packer also checks the
    source identity and re-reads the last rows (``resumable_rows``)."""
    if not isinstance(record, dict):
        return 0
    if any(record.get(k) != v for k, v in (("layer", rr.layer), ("lo", rr.lo), ("hi", rr.hi),
                                            ("total_rows", rr.total_rows), ("row_bytes", rr.row_bytes))):
        return 0
    rows = record.get("rows_done")
    if not isinstance(rows, int) or isinstance(rows, bool) or not 0 <= rows <= rr.rows:
        return 0
    return rows if partial_size >= L.HEADER_BYTES + rows * rr.row_bytes else 0


def resumable_rows(fd: int, journal_path: str, expect: dict, rr: L.RankRange,
                   wloc: L.TensorLoc, sloc: L.TensorLoc) -> int:
    """Rows of the partial open as ``fd`` that a re-run keeps, else 0: the record's count when it
    matches this layout and source (shard names, sizes, mtimes, offsets), the header is right and
    the last recorded rows still equal the source (catches a partial changed behind our back)."""
    rec = read_record(journal_path)
    rows = recorded_rows(rec, rr, os.fstat(fd).st_size)
    if not rows or any(rec.get(k) != v for k, v in expect.items()):
        return 0
    if L.read_exact(fd, L.HEADER_BYTES, 0) != rr.header():
        return 0
    if rows < rr.rows:
        rows -= rows % ALIGN_ROWS        # restart on a page-aligned offset, as O_DIRECT writes need
    n = min(rows, ALIGN_ROWS)
    if n:
        fw, fs = os.open(wloc.path, os.O_RDONLY), os.open(sloc.path, os.O_RDONLY)
        try:
            same = (L.read_exact(fd, n * rr.row_bytes, L.HEADER_BYTES + (rows - n) * rr.row_bytes)
                    == L.source_rows(fw, fs, wloc, sloc, rr.lo + rows - n, n))
        finally:
            os.close(fw)
            os.close(fs)
        if not same:
            log(f"{rr.file_name}.partial: rows {rows - n}..{rows - 1} differ from the source")
            return 0
    return rows


def lock_partial(path: str, create: bool = False) -> int:
    """Open ``path`` read-write holding an exclusive ``flock``, or refuse: two packers must never
    write the same partial (e.g. a re-run while the previous packer, whose ssh session timed out,
    still writes)."""
    fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | (os.O_CREAT if create else 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise PackError(f"another engram pack is writing {path} (an earlier run still going?): wait for "
                        f"it to end or stop it (fuser -v {path}), then re-run; nothing was changed",
                        EXIT_BUSY) from None
    except OSError as exc:               # a filesystem without locks: go on, say so
        log(f"{os.path.basename(path)}: not locked ({exc}); run one packer per directory")
    try:
        same = os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        same = False
    if not same:                         # renamed or replaced between our open and our lock
        os.close(fd)
        raise PackError(f"{path} was replaced by another engram pack while opening it: re-run", EXIT_BUSY)
    return fd


# -- packing one layer ----------------------------------------------------------------------

class Packer:
    def __init__(self, args, layout: L.EngramLayout):
        self.args = args
        self.layout = layout
        head, tail = layout.head_dim, layout.head_dim // L.SCALE_GROUP
        rb = head + tail
        if args.chunk_rows:
            rows = args.chunk_rows
        else:
            rows = max(ALIGN_ROWS, (args.chunk_mib * MiB // rb) // ALIGN_ROWS * ALIGN_ROWS)
        self.chunk_rows = rows
        self.head, self.tail, self.row_bytes = head, tail, rb
        self._buffers: list[ChunkBuffer] | None = None
        self.sync_bytes = max(0, args.sync_mib) * MiB
        self.chunks_written = 0          # across layers (test hook)

    def buffers(self) -> list[ChunkBuffer]:
        if self._buffers is None:
            self._buffers = [ChunkBuffer(self.chunk_rows, self.head, self.tail) for _ in range(N_BUFFERS)]
        return self._buffers

    def pack(self, rr: L.RankRange, wloc: L.TensorLoc, sloc: L.TensorLoc, final: str,
             start_rows: int, journal: Journal, out: int | None = None) -> dict:
        """Write rows ``start_rows..`` into ``<final>.partial`` and rename it to ``final``. ``out``:
        the partial, open and locked (``lock_partial``); owned (closed) here. On any failure or stop
        the rows written so far are synced and recorded (``journal.rows``) before the error goes up."""
        partial = final + ".partial"
        rb, total_rows = self.row_bytes, rr.rows
        if out is None:
            out = lock_partial(partial, create=True)
        direct = fw = fs = None
        state = {"error": None, "rows_done": start_rows, "synced_off": L.HEADER_BYTES + start_rows * rb,
                 "direct_bytes": 0}
        started = time.monotonic()
        try:
            if start_rows == 0:
                journal.remove()                 # a stale record must not outlive the bytes it counted
                os.ftruncate(out, 0)
                os.pwrite(out, rr.header(), 0)
            else:
                os.ftruncate(out, L.HEADER_BYTES + start_rows * rb)   # drop the unrecorded tail
            os.fdatasync(out)
            journal.write(start_rows)
            direct = open_direct(partial) if self.args.direct else None
            fw = os.open(wloc.path, os.O_RDONLY)
            fs = os.open(sloc.path, os.O_RDONLY)
            w_base = wloc.offset + rr.lo * self.head
            s_base = sloc.offset + rr.lo * self.tail
            _fadvise(fw, w_base, rr.rows * self.head, getattr(os, "POSIX_FADV_SEQUENTIAL", 2))
            _fadvise(fs, s_base, rr.rows * self.tail, getattr(os, "POSIX_FADV_SEQUENTIAL", 2))
            free_q: queue.Queue = queue.Queue()
            full_q: queue.Queue = queue.Queue()
            for b in self.buffers():
                free_q.put(b)
            writer = threading.Thread(target=self._writer, name="engram-writer",
                                      args=(out, direct, full_q, free_q, state, journal, rr,
                                            started, start_rows), daemon=True)
            writer.start()
            row = start_rows
            try:
                while row < total_rows and state["error"] is None and not STOP.is_set():
                    n = min(self.chunk_rows, total_rows - row)
                    buf = free_q.get()
                    if buf is None:                      # writer failed
                        break
                    w_off, s_off = w_base + row * self.head, s_base + row * self.tail
                    scatter_read(fw, buf.groups(n, "w"), self.head, w_off, wloc.name)
                    buf.read_scales(fs, n, s_off, sloc.name)
                    _fadvise(fw, w_off, n * self.head, os.POSIX_FADV_DONTNEED)
                    _fadvise(fs, s_off, n * self.tail, os.POSIX_FADV_DONTNEED)
                    full_q.put((buf, row, n))
                    row += n
            finally:
                full_q.put(None)
                writer.join()
            if state["error"] is not None:
                raise state["error"]
            if state["rows_done"] < total_rows:          # only a stop signal ends the loop early
                raise PackError(f"stopped by {signal.Signals(STOP_SIGNAL[0]).name}",
                                128 + STOP_SIGNAL[0])
            os.fsync(out)
            size = os.fstat(out).st_size
            if size != rr.packed_bytes:
                raise PackError(f"{partial} has {size} bytes after packing, expected {rr.packed_bytes}",
                                EXIT_IO)
            os.replace(partial, final)               # only a complete file gets the final name
            _fsync_dir(os.path.dirname(final) or ".")
            journal.remove()
        except BaseException:
            self._save_progress(out, journal, state, rr)
            raise
        finally:
            for fd in (out, direct, fw, fs):
                if fd is not None:
                    os.close(fd)
        return {"seconds": time.monotonic() - started, "direct_bytes": state["direct_bytes"],
                "bytes_written": (total_rows - start_rows) * rb + (L.HEADER_BYTES if start_rows == 0 else 0)}

    def _save_progress(self, out: int, journal: Journal, state: dict, rr: L.RankRange) -> None:
        """After a failure or a stop: keep the whole chunks written so far (sync, drop the torn
        chunk's bytes, which also frees space for the record, then record). Best effort: if this
        fails too, the previous record still stands (the partial is never cut below it)."""
        rows = state["rows_done"]
        try:
            os.ftruncate(out, L.HEADER_BYTES + rows * self.row_bytes)
            if journal.rows is None or rows > journal.rows:
                os.fdatasync(out)
                journal.write(rows)
        except (OSError, PackError) as exc:
            log(f"{rr.file_name}: could not record progress at row {rows} ({exc}); "
                f"the last record (row {journal.rows or 0}) stands")

    def _writer(self, out, direct, full_q, free_q, state, journal, rr, started, start_rows):
        rb = self.row_bytes
        unsynced = 0
        args = self.args
        try:
            while True:
                item = full_q.get()
                if item is None:
                    break
                buf, row, n = item
                off = L.HEADER_BYTES + row * rb
                view = buf.mv[:n * rb]
                if direct is not None and off % DIRECT_ALIGN == 0 and len(view) % DIRECT_ALIGN == 0:
                    try:
                        write_all(direct, view, off)
                        state["direct_bytes"] += len(view)
                        buffered = False
                    except OSError as exc:
                        if exc.errno != errno.EINVAL:
                            raise
                        log(f"O_DIRECT write refused ({exc}); buffered writes from here on")
                        direct = None            # pack() closes the descriptor
                        buffered = True
                else:                            # no O_DIRECT here, or the short last chunk
                    buffered = True
                if buffered:
                    write_all(out, view, off)
                free_q.put(buf)
                if buffered:
                    # DONTNEED on dirty pages starts their writeback without waiting (WB_SYNC_NONE),
                    # like sync_file_range(SYNC_FILE_RANGE_WRITE): the disk stays busy between syncs
                    # and the fdatasync below finds little left to do.
                    _fadvise(out, off, n * rb, os.POSIX_FADV_DONTNEED)
                unsynced += n * rb
                state["rows_done"] = row + n     # whole chunk written (not yet durable)
                last = row + n == rr.rows
                if unsynced >= self.sync_bytes or last:
                    self._sync(out, state, journal, row + n)
                    unsynced = 0
                self.chunks_written += 1
                if args.progress_every and (self.chunks_written % args.progress_every == 0 or last):
                    dt = max(time.monotonic() - started, 1e-9)
                    mbs = (row + n - start_rows) * rb / dt / 1e6
                    pct = 100.0 * (row + n) / max(rr.rows, 1)
                    left = (rr.rows - row - n) * rb / (mbs * 1e6) if mbs > 0 else 0.0
                    log(f"{rr.file_name}: {pct:5.1f}% {(row + n) * rb / GiB:.2f}/{rr.rows * rb / GiB:.2f} GiB "
                        f"{mbs:.0f} MB/s eta {left:.0f}s")
                if args.stop_after_chunks and self.chunks_written >= args.stop_after_chunks:
                    log(f"test hook: stopping hard after {self.chunks_written} chunk(s)")
                    os._exit(EXIT_TEST_STOP)            # simulates a kill: no cleanup at all
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            state["error"] = exc
            free_q.put(None)
            while full_q.get() is not None:            # drain so the reader can finish
                pass

    def _sync(self, out, state, journal, rows_done):
        os.fdatasync(out)
        end = L.HEADER_BYTES + rows_done * self.row_bytes
        _fadvise(out, state["synced_off"], end - state["synced_off"], os.POSIX_FADV_DONTNEED)
        state["synced_off"] = end
        journal.write(rows_done)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
