"""The one progress channel for long work: step code counts (bytes, files, ranks, requests done of a total, with a
label) and each face shows it its own way.

    with progress.count("weights download head", total=size, unit="B") as bar:
        bar.update(done)                  # absolute count; never goes back (a retry from byte 0 does not count down)
    node.run(cmd, lines=progress.relay("head "))     # a node tool's own counting lines, same format
    with progress.from_tool("worker image load", size, progress.DD_BYTES) as (bar, lines):
        node.run("dd if=x.tar status=progress | docker load", lines=lines)     # another tool's progress lines

The wire form is one text line, the Engram packer's (``engram_tools/pack_writer.py``):
``<label>: <pct>% <done>/<total> <unit>[ <rate>][ eta <s>s]`` — :func:`line` writes it, :func:`parse` reads it; the
standard-library tools that run on a node (the packer, ``weights_tools/node_download.py``) print the same form and
:func:`relay` feeds their lines back into the channel. Where a count goes (chosen once per process, :func:`sink`):

* under ``python -m runbook run`` (the runner sets ``RUNBOOK_PROGRESS_FILE`` in the kernel's environment): one
  line per update, at most every :data:`EVERY_S`, appended to that file; the console follows it and draws its live
  line (a bar and ETA on a terminal, a few plain lines in a pipe: ``console.py``). Nothing per tick reaches the
  notebook;
* in a Jupyter kernel otherwise (JupyterLab by hand): an ipywidgets bar per count, updated at most every
  :data:`EVERY_S`;
* elsewhere (a command in a terminal, a test): a line on stderr only after :data:`QUIET_S` without an end, then each
  time the count has run four times as long, and the end of such a long count.

In a kernel each count's final line is printed into the cell's output when it ends (the archived notebook shows
the final counts), and every process keeps the final counts (:func:`finals`): ``Step.finish`` writes them into the
step's sidecar (``data["progress"]``), masked like the rest of it.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

#: the environment key the runner sets for a step's kernel: the file its console follows
FILE_ENV = "RUNBOOK_PROGRESS_FILE"
#: at most one update per count this often (file lines, widget updates)
EVERY_S = 1.0
#: elsewhere (no console, no kernel): quiet this long, then at 4x the time so far
QUIET_S = 30.0
#: a line that counts work (the packer's form)
WORK = re.compile(r"(?P<pct>\d+(?:\.\d+)?)%\s+(?P<done>\d+(?:\.\d+)?)/(?P<total>\d+(?:\.\d+)?)\s*(?P<unit>[A-Za-z]+)?")
GIVEN_ETA = re.compile(r"\beta\s+(\d+(?:\.\d+)?)\s*s\b")
_BINARY = (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024))


@dataclass(frozen=True)
class Reading:
    """One counting line, read back: ``done``/``total`` in ``unit`` as the line wrote them."""
    label: str
    pct: float
    done: float
    total: float
    unit: str
    eta_s: float | None = None
    done_text: str = ""
    total_text: str = ""


def scaled(done: float, total: float, unit: str) -> tuple[str, str, str]:
    """Both figures in one unit a person reads: bytes in the total's binary unit (two decimals), seconds with one,
    whole counts whole, others with two."""
    if unit == "B":
        for name, size in _BINARY:
            if total >= size:
                return f"{done / size:.2f}", f"{total / size:.2f}", name
        return f"{done:.0f}", f"{total:.0f}", "B"
    if unit == "s":
        return f"{done:.1f}", f"{total:.1f}", "s"
    if float(done).is_integer() and float(total).is_integer():
        return f"{done:.0f}", f"{total:.0f}", unit
    return f"{done:.2f}", f"{total:.2f}", unit          # a count read back from a node's line (GiB)


def line(label: str, done: float, total: float, unit: str = "", eta_s: float | None = None) -> str:
    """The wire form of one count: ``weights head: 45.0% 1.20/2.70 GiB eta 3s``."""
    pct = 100.0 * done / total if total else 100.0
    d, t, u = scaled(done, total, unit)
    text = f"{label}: {min(pct, 100.0):5.1f}% {d}/{t} {u}".rstrip()
    return text + (f" eta {eta_s:.0f}s" if eta_s is not None else "")


def parse(text: str) -> Reading | None:
    """The count a line reports, or None (the inverse of :func:`line`; the packer's lines too)."""
    m = WORK.search(text)
    if not m:
        return None
    given = GIVEN_ETA.search(text[m.end():])
    return Reading(label=text[:m.start()].strip().rstrip(":").strip(), pct=min(float(m["pct"]), 100.0),
                   done=float(m["done"]), total=float(m["total"]), unit=m["unit"] or "",
                   eta_s=float(given.group(1)) if given else None, done_text=m["done"], total_text=m["total"])


# ---------------------------------------------------------------------------------------------- where counts go
class FileSink:
    """Under the runner: one line per update appended to the file its console follows."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()

    def show(self, counter: "Counter", text: str, final: bool) -> None:
        with self._lock, open(self.path, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")


class WidgetSink:
    """In a Jupyter kernel by hand: one ipywidgets bar per count (a label, the bar, the figures)."""

    def __init__(self):
        self._bars: dict[int, tuple] = {}
        self._lock = threading.Lock()

    def show(self, counter: "Counter", text: str, final: bool) -> None:
        import ipywidgets as w
        from IPython.display import display
        reading = parse(text)
        figures = text[len(counter.label) + 1:].strip() if reading is not None else text
        with self._lock:
            made = self._bars.get(id(counter))
            if made is None:
                bar = w.FloatProgress(value=0.0, min=0.0, max=100.0, description=counter.label[:40],
                                      style={"description_width": "initial"},
                                      layout=w.Layout(width="60%"))
                note = w.Label(value="")
                made = self._bars[id(counter)] = (w.HBox([bar, note]), bar, note)
                display(made[0])
            _, bar, note = made
            bar.value = reading.pct if reading is not None else bar.value
            note.value = figures
            if final:
                bar.bar_style = "success"
                del self._bars[id(counter)]


class StreamSink:
    """Elsewhere: quiet for :data:`QUIET_S`, then a line each time the count has run four times as long, and the end
    of a count that spoke."""

    def __init__(self, stream=None):
        self.stream = stream
        self._next: dict[int, float] = {}

    def show(self, counter: "Counter", text: str, final: bool) -> None:
        now = time.monotonic()
        due = self._next.setdefault(id(counter), counter.started + QUIET_S)
        spoke = due > counter.started + QUIET_S
        if final:
            self._next.pop(id(counter), None)
            if not spoke:
                return
        elif now < due:
            return
        else:
            self._next[id(counter)] = now + max(QUIET_S, 3 * (now - counter.started))   # as the console: 4x
        print(text, file=self.stream or sys.stderr, flush=True)


_sink = None
_sink_lock = threading.Lock()


def sink():
    """Where this process's counts go (see the module docstring); chosen on first use."""
    global _sink
    with _sink_lock:
        if _sink is None:
            path = os.environ.get(FILE_ENV, "")
            if path:
                _sink = FileSink(path)
            elif in_kernel():
                _sink = WidgetSink()
            else:
                _sink = StreamSink()
        return _sink


def use(new_sink) -> None:
    """Set where counts go (a test; None: choose again on next use)."""
    global _sink
    with _sink_lock:
        _sink = new_sink


def in_kernel() -> bool:
    """A Jupyter kernel with ipywidgets at hand (JupyterLab, nbclient)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    if importlib.util.find_spec("ipywidgets") is None:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


# ---------------------------------------------------------------------------------------------- the counts
_finals: dict[str, dict] = {}
_finals_lock = threading.Lock()


def finals() -> dict[str, dict]:
    """Each count's last figures in this process since :func:`reset`: {label: {done, total, unit, seconds, ended}}."""
    with _finals_lock:
        return {k: dict(v) for k, v in _finals.items()}


def reset() -> None:
    """Forget the final counts (a step begins)."""
    with _finals_lock:
        _finals.clear()


class Counter:
    """One counted piece of work. ``update`` (absolute) / ``advance`` (by n); ``close`` ends it (also on
    ``with`` exit). Thread-safe; updates are cheap between shown ones (a clock read)."""

    def __init__(self, label: str, total: float, unit: str = "", *, every_s: float = EVERY_S, to=None):
        if total < 0:
            raise ValueError(f"progress {label!r}: total {total} is negative")
        self.label, self.total, self.unit = label, float(total), unit
        self.done = 0.0
        self.every_s = every_s
        self.started = time.monotonic()
        self.closed = False
        self._to = to
        self._shown_at: float | None = None
        self._shown: tuple[float, float] | None = None
        self._first: tuple[float, float] | None = None         # (when, done) at the first update: the ETA's base
        self._lock = threading.Lock()
        self._record()

    def _record(self) -> None:
        with _finals_lock:
            _finals[self.label] = {"done": self.done, "total": self.total, "unit": self.unit,
                                   "seconds": round(time.monotonic() - self.started, 3), "ended": self.closed}

    def eta(self) -> float | None:
        """Seconds left at the rate since the first update (what was done before it, a kept partial, is not
        rate); none for a wait (``s``: its total is a limit, not the work)."""
        if self.unit == "s" or self._first is None or self.done >= self.total:
            return None
        t0, d0 = self._first
        spent, gained = time.monotonic() - t0, self.done - d0
        return (self.total - self.done) * spent / gained if spent > 0 and gained > 0 else None

    def update(self, done: float, total: float | None = None) -> None:
        """``done`` so far (kept at the highest seen); ``total`` when it became known or changed."""
        with self._lock:
            if self.closed:
                return
            if total is not None:
                self.total = float(total)
            self.done = max(self.done, min(float(done), self.total))
            if self._first is None:
                self._first = (time.monotonic(), self.done)
            now = time.monotonic()
            if self._shown_at is not None:
                if (self.done, self.total) == self._shown:
                    return                              # nothing new
                if now - self._shown_at < self.every_s and self.done < self.total:
                    return                              # throttled (reaching the total is always shown)
            self._shown_at, self._shown = now, (self.done, self.total)
            self._show(final=False)

    def advance(self, n: float = 1) -> None:
        self.update(self.done + n)

    def close(self) -> None:
        """The end: the last figures shown and kept; in a kernel, printed into the cell's output."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            text = self._show(final=True)
        if in_kernel():
            print(text, flush=True)

    def _show(self, final: bool) -> str:
        text = line(self.label, self.done, self.total, self.unit, None if final else self.eta())
        if final:
            text += f" in {time.monotonic() - self.started:.1f}s"
        self._record()
        try:
            (self._to or sink()).show(self, text, final)
        except Exception as exc:  # noqa: BLE001 - progress must never end the work it reports
            print(f"progress: {type(exc).__name__}: {exc}", file=sys.stderr)
        return text

    def __enter__(self) -> "Counter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def count(label: str, total: float, unit: str = "", **kw) -> Counter:
    """A new count (see :class:`Counter`)."""
    return Counter(label, total, unit, **kw)


#: ``dd status=progress`` (stderr): ``1234567 bytes (1.2 MB, 1.2 MiB) copied, 1 s, 1.2 MB/s``
DD_BYTES = re.compile(r"^(\d+) bytes\b")
#: ``rsync --info=progress2``: ``  1,234,567  45%   10.50MB/s    0:00:12`` (the separators follow the locale)
RSYNC_BYTES = re.compile(r"^\s*(\d[\d,.']*)\s+\d+%")


class _Uncounted:
    def update(self, *a, **k) -> None:
        pass


@contextlib.contextmanager
def from_tool(label: str, total: float, pattern: re.Pattern, *, dry_run: bool = False):
    """A byte count fed by another tool's own progress lines (:data:`DD_BYTES`, :data:`RSYNC_BYTES`: the first group
    is the bytes so far): ``with from_tool(...) as (bar, lines): node.run(cmd, lines=lines)``. A dry run counts
    nothing (``lines`` is None)."""
    if dry_run:
        yield _Uncounted(), None
        return
    with count(label, total, "B") as bar:
        def lines(text: str) -> None:
            m = pattern.match(text)
            if m:
                bar.update(int(re.sub(r"\D", "", m.group(1))))
        yield bar, lines


class relay:
    """A line sink for a node tool's output (``node.run(cmd, lines=relay("head "))``): its counting lines drive one
    :class:`Counter` per label (``prefix`` + the tool's label), every other line is echoed as before (the cell's
    output; ``quiet``: dropped, the command's result keeps them). ``close()`` (also ``with``) ends the counts it
    made."""

    def __init__(self, prefix: str = "", echo: Callable[[str], None] | None = None, *, quiet: bool = False):
        self.prefix = prefix
        self.echo = echo if echo is not None else (lambda text: None) if quiet else \
            (lambda text: print(text, flush=True))
        self.counters: dict[str, Counter] = {}
        self._lock = threading.Lock()

    def __call__(self, text: str) -> None:
        reading = parse(text)
        if reading is None:
            if text.strip():
                self.echo(text)
            return
        label = f"{self.prefix}{reading.label}"
        with self._lock:
            counter = self.counters.get(label)
            if counter is None:
                counter = self.counters[label] = Counter(label, reading.total, reading.unit)
        counter.update(reading.done, reading.total)
        if reading.done >= reading.total:
            counter.close()

    def close(self) -> None:
        for counter in list(self.counters.values()):
            counter.close()

    def __enter__(self) -> "relay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
