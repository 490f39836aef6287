#!/usr/bin/env python3
"""The packer's write path: page-aligned chunk buffers filled by scatter-reads, a writer thread,
O_DIRECT writes with a buffered fallback, and the periodic sync that records progress (``Packer``).

STANDALONE, STDLIB ONLY: part of ``pack.py`` (shipped next to it, ``pack_partial.py`` and ``layout.py``).
"""
from __future__ import annotations

import errno
import mmap
import os
import queue
import signal
import sys
import threading
import time

try:                                   # imported as runbook.engram_tools.pack_writer (tests, laptop)
    from . import layout as L
    from .pack_partial import (ALIGN_ROWS, EXIT_IO, EXIT_TEST_STOP, Journal, PackError, fsync_dir, lock_partial,
                               log, write_all)
except ImportError:                    # run as a script next to layout.py (nodes); also under
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # python3 -I / PYTHONSAFEPATH
    import layout as L  # type: ignore[no-redef]
    from pack_partial import (ALIGN_ROWS, EXIT_IO, EXIT_TEST_STOP, Journal, PackError,  # type: ignore[no-redef]
                              fsync_dir, lock_partial, log, write_all)

IOV_GROUP = 1024                       # <= IOV_MAX (1024 on Linux)
DIRECT_ALIGN = 4096                    # O_DIRECT offset/length alignment we keep to (page size)
N_BUFFERS = 3                          # one being read, one being written, one spare
MiB, GiB = 1 << 20, 1 << 30
STOP = threading.Event()               # set by SIGTERM/SIGHUP/SIGINT: finish the chunk in hand, record, exit
STOP_SIGNAL = [0]


def _fadvise(fd: int, offset: int, length: int, advice: int) -> None:
    try:
        os.posix_fadvise(fd, offset, length, advice)
    except (AttributeError, OSError):  # not fatal: only a page-cache hint
        pass


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


# -- packing one layer ----------------------------------------------------------------------


def scaled_bytes(done: int, total: int) -> str:
    """``1.20/2.70 GiB``: both in the total's binary unit, as ``runbook.progress.line`` writes a count of bytes
    (this tool imports nothing of the runbook); a lab-sized file reads in MiB, not ``0.00/0.01 GiB``."""
    for name, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if total >= size:
            return f"{done / size:.2f}/{total / size:.2f} {name}"
    return f"{done}/{total} B"

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
            fsync_dir(os.path.dirname(final) or ".")
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
                    log(f"{rr.file_name}: {pct:5.1f}% {scaled_bytes((row + n) * rb, rr.rows * rb)} "
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
