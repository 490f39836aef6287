"""Bounded reading of what a user hands ``diagnose``: log files, folders of logs, support bundles.

Every input is opened without blocking (a FIFO never waits for a writer), must be a regular file (``/dev/zero``,
a device, a socket or a FIFO is refused before one byte is read), and is read in chunks against one byte budget
shared by all inputs of a call (:data:`MAX_INPUT_BYTES`): a file over it is refused from its size, a file that
grows past it is refused at the chunk that crosses it. A NUL byte, or a first chunk that is mostly not text,
refuses the file as "not a text log". Only the last :data:`KEEP_BYTES` of each file are kept in memory (the
failure is usually last). Every refusal is an :class:`InputError`: exit 2, the path and the fix named.
"""
from __future__ import annotations

import os
import stat
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError

MAX_INPUT_BYTES = 64 << 20        # all inputs of one call together; a bring-up log is a few MiB
KEEP_BYTES = 8 << 20              # the end of each file that is matched (offline.MAX_TEXT_BYTES)
MAX_FILES = 10_000                # files in the folders and archives of one call
CHUNK = 1 << 20
SNIFF = 64 << 10                  # the first bytes judged for "mostly not text"
NOT_TEXT_SHARE = 0.10             # more undecodable or control bytes than this in SNIFF: a binary file


class InputError(UsageError):
    """An input of ``diagnose`` is missing, unreadable, too large, not a regular file or not text (exit 2)."""


@dataclass
class Budget:
    """Bytes and files still allowed for the inputs of one call."""
    left: int = MAX_INPUT_BYTES
    files: int = MAX_FILES

    def take_file(self, where: str) -> None:
        self.files -= 1
        if self.files < 0:
            raise InputError(f"{where}: more than {MAX_FILES} files in the folders and archives given",
                             fix="pass the support bundle or the rank logs themselves, not a whole tree")

    def take(self, n: int, where: str) -> None:
        self.left -= n
        if self.left < 0:
            raise too_large(where)


def too_large(where: str, size: int = 0) -> InputError:
    what = f"is {size / (1 << 20):.0f} MiB" if size else "takes the inputs past"
    return InputError(f"{where} {what}: diagnose reads at most {MAX_INPUT_BYTES >> 20} MiB (all inputs together)",
                      fix=f"pass the end of the log (tail -c 8M {where} > end.log: the failure is usually last), "
                          "or fewer files")


def _not_text(where: str, why: str) -> InputError:
    return InputError(f"{where}: this is not a text log ({why})",
                      fix="pass the rank's log (docker logs, the vLLM log file), a diagnose-*.tar.gz or its folder")


def _open_regular(path: Path) -> tuple[int, os.stat_result]:
    """An fd on a regular file, opened without blocking and checked on the opened file itself."""
    where = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"no such log or bundle: {where}",
                         fix="pass existing files, a diagnose-*.tar.gz or its folder") from None
    except OSError as exc:
        raise InputError(f"cannot read {where}: {exc.strerror or exc}",
                         fix=f"make it readable by this user (ls -l {where})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = ("a character device" if stat.S_ISCHR(st.st_mode) else "a block device" if stat.S_ISBLK(st.st_mode)
                else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "not a regular file")
        raise InputError(f"{where} is {kind}, not a log file (a device or pipe can be endless)",
                         fix="save the output to a file first (e.g. docker logs vllm > rank.log 2>&1) and pass that")
    return fd, st


def _looks_binary(head: bytes) -> str:
    """Why the first bytes of a file are not text, or ''."""
    if not head:
        return ""
    text = head.decode("utf-8", "replace")
    if len(head) == SNIFF:                      # a multi-byte character cut at the end is not a sign
        text = text.rstrip("\ufffd") or text
    bad = sum(1 for c in text if c == "\ufffd" or (ord(c) < 32 and c not in "\t\n\r\f\b\x1b"))
    if text and bad / len(text) > NOT_TEXT_SHARE:
        return f"{bad} of its first {len(text)} characters are not text"
    return ""


def _whole_lines(data: bytes, cut: bool) -> str:
    """The text of ``data``; when its start was cut off, from the first whole line (half a secret matches no
    shape the redactor knows)."""
    return (data.partition(b"\n")[2] if cut else data).decode("utf-8", "replace")


def read_text(path: str | Path, budget: Budget, *, where: str = "") -> str:
    """The end of a text file (at most :data:`KEEP_BYTES`), read in chunks within ``budget``."""
    where = where or str(path)
    budget.take_file(where)
    fd, st = _open_regular(Path(path))
    try:
        kept = bytearray()
        head = b""
        offset = 0
        while True:
            try:
                chunk = os.read(fd, SNIFF if not offset else CHUNK)
            except OSError as exc:
                raise InputError(f"cannot read {where}: {exc.strerror or exc}",
                                 fix=f"check the file (ls -l {where})") from None
            nul = chunk.find(b"\0")
            if nul >= 0:
                raise _not_text(where, f"a NUL byte at offset {offset + nul}")
            if not offset:                   # the first bytes say "binary" before the size says "too large"
                head = chunk
                why = _looks_binary(head)
                if why:
                    raise _not_text(where, why)
                if st.st_size > budget.left:
                    raise too_large(where, st.st_size)
            if not chunk:
                break
            budget.take(len(chunk), where)   # a file that grows while it is read stops here
            offset += len(chunk)
            kept += chunk
            if len(kept) > KEEP_BYTES:
                del kept[:len(kept) - KEEP_BYTES]
        return _whole_lines(bytes(kept), offset > KEEP_BYTES)
    finally:
        os.close(fd)


def check_file(path: str | Path, budget: Budget) -> None:
    """Refuse what :func:`read_text` would refuse from the file's kind and size alone, reading nothing: for a reader
    elsewhere (the accuracy corpus) that then reads the file whole."""
    where = str(path)
    budget.take_file(where)
    fd, st = _open_regular(Path(path))
    os.close(fd)
    if st.st_size > budget.left:
        raise too_large(where, st.st_size)
    budget.take(st.st_size, where)


def read_folder(path: Path, budget: Budget) -> dict[str, str]:
    """Every file under a folder (relative posix path -> text), in name order, each read by :func:`read_text`."""
    found = []
    for p in path.rglob("*"):
        if not p.is_dir():
            found.append(p)
            if len(found) > budget.files:
                budget.take_file(str(p))
    return {p.relative_to(path).as_posix(): read_text(p, budget) for p in sorted(found)}


def read_archive(path: Path, budget: Budget) -> dict[str, str]:
    """The regular members of a ``.tar.gz`` (name -> text): the archive itself counts against the budget, each
    member's declared size is checked before it is unpacked, and a member with a NUL byte is refused."""
    where = str(path)
    budget.take_file(where)
    fd, st = _open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        if st.st_size > budget.left:
            raise too_large(where, st.st_size)
        budget.take(st.st_size, where)
        out: dict[str, str] = {}
        try:
            with tarfile.open(fileobj=fh, mode="r:gz") as tar:
                for m in tar:
                    name = f"{where}:{m.name}"
                    budget.take_file(name)                 # every member counts: a million empty ones too
                    if not m.isfile():
                        continue
                    budget.take(m.size, name)              # the declared size, before a byte is unpacked
                    data = tar.extractfile(m).read(m.size)
                    nul = data.find(b"\0")
                    if nul >= 0:
                        raise _not_text(name, f"a NUL byte at offset {nul}")
                    out[m.name] = _whole_lines(data[-KEEP_BYTES:], len(data) > KEEP_BYTES)
        except (tarfile.TarError, EOFError, zlib.error) as exc:
            raise InputError(f"{where} is not a diagnose archive ({exc})",
                             fix="pass the diagnose-*.tar.gz that `python -m runbook diagnose` wrote, its folder, "
                                 "or a plain log") from None
        return out
