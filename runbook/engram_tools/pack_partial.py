#!/usr/bin/env python3
"""A packed file in progress, ``<final>.partial``: its durable progress record (``Journal``), the rows a
re-run keeps of it, and the lock that keeps a second packer off it; also the packer's errors and exit codes.

STANDALONE, STDLIB ONLY: part of ``pack.py`` (shipped next to it and ``layout.py``, never run on its own).
``recorded_rows`` and ``ALIGN_ROWS`` are also what the step's free-space pre-check counts with.
"""
from __future__ import annotations

import fcntl
import json
import os
import sys

try:                                   # imported as runbook.engram_tools.pack_partial (tests, laptop)
    from . import layout as L
except ImportError:                    # run as a script next to layout.py (nodes); also under
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # python3 -I / PYTHONSAFEPATH
    import layout as L  # type: ignore[no-redef]

TOOL = "engram-pack"
# pack.py's exit codes (its docstring); here because every part of the packer raises them.
EXIT_REFUSED, EXIT_SPACE, EXIT_IO, EXIT_BUSY, EXIT_TEST_STOP = 2, 3, 4, 5, 75   # a stop signal: 128 + signum
RECORD_BYTES = 4096                    # a progress record is one page, rewritten in place
ALIGN_ROWS = 512                       # 512 rows * 264 B = 33 pages: chunk writes stay page aligned


class PackError(Exception):
    def __init__(self, message: str, code: int, details: dict | None = None):
        super().__init__(message)
        self.code = code
        self.details = details or {}     # extra keys for the JSON summary (space, kept rows)


def log(msg: str) -> None:
    print(f"[{TOOL}] {msg}", flush=True)


def write_all(fd: int, view: memoryview, off: int) -> None:
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], off + done)


def fsync_dir(path: str) -> None:
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
        fsync_dir(os.path.dirname(self.path) or ".")
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
    identity): precheck.py's space check uses it on what it read from a node; the packer also checks the
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
