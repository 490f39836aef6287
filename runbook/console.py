"""What ``python -m runbook run`` shows a person: one live line per step, warnings and failures in full with
their fix, one summary table, the verdict in one line and the report's path.

    console = Console(verbose=False)              # -v: the full stream on the terminal too
    with console.capture_stdio():                 # stray prints of the run's own process: into the full stream
        runner.run(..., echo=console.say, console=console)
    console.finish(outcomes, ...)

Everything printed is also written, secrets masked, to ``console.log`` in the run folder: the notices, every line
papermill streams (its ``Executing Cell N`` / ``Ending Cell N`` markers and each cell's output), the kernel's own
stderr (its transport warning) and the summary. On a terminal the live line is drawn by rich; anything else (CI,
a pipe, ``TERM=dumb``) gets plain lines with no control codes, and ``NO_COLOR`` drops colour (rich honours it).

The live line counts cells (``cell 5/12``); a line that counts work (``runbook.progress``, the one progress channel:
``<what>: 45.0% 1.20/2.70 GiB 500 MB/s eta 3s``), from the file the kernel's counts go to (:meth:`Console.follow_file`
with ``counts=True``) or streamed by a cell, moves the bar to that work and shows its ETA. Without a terminal a step
that counts work says where it is after :data:`PLAIN_EVERY_S`, then each time the step has run four times as long: a
few lines for hours of download, one for a phase of minutes, none for a phase shorter than a minute.
"""
from __future__ import annotations

import contextlib
import io
import logging
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from . import progress
from .checks import Check, Status, first_fix

ARCHIVE_NAME = "console.log"

#: papermill's cell markers (engines.py: ``Executing Cell {n:-<40}`` / ``Ending Cell {n:-<43}``)
CELL_MARK = re.compile(r"^(Executing|Ending) Cell (\d+)-*\s*$")
#: papermill's own lines around a notebook, and a styled table's repr: not what the step is doing
FRAMING = ("Input Notebook:", "Output Notebook:", "Working directory:", "Executing notebook with kernel:",
           "<pandas.io.formats.style.Styler")
#: the order check counts are written in; zero counts are left out
COUNT_ORDER = (Status.PASS, Status.WARN, Status.FAIL, Status.NA, Status.NOOP, Status.SIMULATED)
#: rows printed in full when a step ends
SHOWN = (Status.FAIL, Status.WARN)
#: without a terminal (no live line) a step that counts work first says where it is after this long, then each
#: time the step has run four times as long (1, 4, 16, 64 … min into the step)
PLAIN_EVERY_S = 60.0


def duration(seconds: float) -> str:
    """``48.2 s``, ``1 min 12 s``, ``2 h 03 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def count_text(counts: dict[str, int]) -> str:
    """``31 PASS, 1 WARN, 2 N/A`` (the statuses that occur, in a fixed order)."""
    return ", ".join(f"{counts[s.value]} {s.value}" for s in COUNT_ORDER if counts.get(s.value))


def row_text(row: Check) -> str:
    """One check row in full: status, node, name, what was seen, what was expected, the fix."""
    where = f"{row.node}: " if row.node else ""
    text = f"{row.status.value} {where}{row.name}: {row.observed}"
    if row.expected:
        text += f" (expected {row.expected})"
    if row.fix:
        text += f"\n  fix: {row.fix}"
    return text


@dataclass
class Work:
    """Counted work of the step now running, from its latest counting line."""
    pct: float
    done: str
    total: str
    unit: str
    eta_s: float | None
    label: str = ""                                                  # what is counted: the line before its figures
    seen: list[tuple[float, float]] = field(default_factory=list)   # (monotonic time, pct)

    def eta(self) -> float | None:
        """The line's own ETA, else the rate since the first line of this work; none for a wait (seconds of a
        limit: ``ready wait``)."""
        if self.eta_s is not None:
            return self.eta_s
        if self.unit == "s":
            return None
        if len(self.seen) < 2:
            return None
        (t0, p0), (t1, p1) = self.seen[0], self.seen[-1]
        if p1 <= p0 or t1 <= t0:
            return None
        return (100.0 - p1) * (t1 - t0) / (p1 - p0)


def parse_work(line: str, before: Work | None = None, now: float | None = None) -> Work | None:
    """The counted work a streamed line reports, or None. ``before``: the same work's previous line (its
    samples are kept for the ETA while the total and unit stay the same)."""
    reading = progress.parse(line)
    if reading is None:
        return None
    now = time.monotonic() if now is None else now
    work = Work(pct=reading.pct, done=reading.done_text, total=reading.total_text, unit=reading.unit,
                eta_s=reading.eta_s, label=reading.label)
    same = before is not None and (before.total, before.unit) == (work.total, work.unit) and before.pct <= work.pct
    work.seen = (before.seen if same else []) + [(now, work.pct)]
    return work


@dataclass
class StepResult:
    """What the summary shows of one step."""
    name: str
    status: str
    seconds: float
    counts: dict[str, int] = field(default_factory=dict)
    error: str = ""


class Console:
    """The run's face on the terminal and its full stream in the run folder (see the module docstring)."""

    def __init__(self, *, verbose: bool = False, file=None, redact: Callable[[str], str] | None = None):
        from rich.console import Console as RichConsole
        self.out = RichConsole(file=file if file is not None else sys.stdout, highlight=False, emoji=False)
        self.live = self.out.is_terminal and not self.out.is_dumb_terminal
        self.verbose = verbose
        self.redact = redact or (lambda text: text)
        self.archive_path: Path | None = None
        self._pending: list[str] = []
        self._lock = threading.RLock()
        self._progress = None
        self._task = None
        self._step = ""
        self._cells = 0
        self._work: Work | None = None
        self._plain_next = 0.0
        self.results: list[StepResult] = []
        self.failing: list[tuple[str, list[Check]]] = []     # (step, its FAIL rows), for first_fix_text
        self.report_path: Path | None = None
        self.report_verdict = ""

    # ------------------------------------------------------------------ the full stream
    def archive_to(self, path: Path, redact: Callable[[str], str] | None = None) -> None:
        """From now on every line is appended to ``path`` (secrets masked); the lines said before are written
        first."""
        with self._lock:
            if redact is not None:
                self.redact = redact
            self.archive_path = Path(path)
            self.archive_path.parent.mkdir(parents=True, exist_ok=True)
            pending, self._pending = self._pending, []
            self._append(pending)

    def _append(self, lines: Iterable[str]) -> None:
        lines = [self.redact(line) for line in lines]
        if self.archive_path is None:
            self._pending.extend(lines)
            return
        if lines:
            with self.archive_path.open("a", encoding="utf-8") as fh:
                fh.write("".join(line + "\n" for line in lines))

    def _print(self, text: str, style: str = "") -> None:
        """One message above the live line (or a plain line), never parsed as markup."""
        from rich.text import Text
        # the terminal wraps a long line (a path stays one line for a copy, and for tmux -J)
        self.out.print(Text(self.redact(text), style=style if self.live else ""), soft_wrap=True)

    # ------------------------------------------------------------------ what the runner says
    def say(self, line: str) -> None:
        """A notice the person reads (the lab, the lock, reuse, resume): shown and archived."""
        with self._lock:
            self._append(line.splitlines() or [""])
            self._print(line)

    def detail(self, line: str, *, moves: bool = True) -> None:
        """One line of the full stream (papermill's markers, a cell's output, the kernel's stderr): archived,
        shown only with -v. ``moves``: it may move the live line (cell count, counted work, latest output)."""
        with self._lock:
            lines = line.rstrip("\n").splitlines() or [""]
            self._append(lines)
            if self.verbose:
                for one in lines:
                    self._print(one, style="dim")
            if moves:
                for one in lines:
                    self._follow(one)

    def counted(self, line: str) -> None:
        """One line of the progress channel: moves the live line (the bar, its ETA; plain: a few lines)."""
        with self._lock:
            self._follow(line)

    def _follow(self, line: str) -> None:
        if not self._step:
            return
        mark = CELL_MARK.match(line.strip())
        if mark:
            if mark.group(1) == "Executing":
                self._work = None                       # a new cell: its own work, if it counts any
                self._update(cell=int(mark.group(2)))
            return
        work = parse_work(line, self._work)
        if work is not None:
            self._work = work
            self._update(detail=work.label)
        elif line.strip() and not line.startswith(FRAMING):
            self._update(detail=line.strip())

    # ------------------------------------------------------------------ one step
    @contextlib.contextmanager
    def step(self, name: str, cells: int = 0) -> Iterator[None]:
        """The live line of one step while it runs (plain mode: one line when it starts)."""
        with self._lock:
            self._step, self._cells, self._work = name, cells, None
            self._started, self._plain_next = time.monotonic(), time.monotonic() + PLAIN_EVERY_S
            self._append([f"--- {name}"])
            if self.live:
                self._ensure_progress()
                self._task = self._progress.add_task(name, total=cells or None, work="", eta="", detail="")
            else:
                self._print(f"{name}: running")
        try:
            yield
        finally:
            with self._lock:
                if self._task is not None:
                    self._progress.remove_task(self._task)
                    self._task = None
                self._step, self._work = "", None

    def _ensure_progress(self) -> None:
        if self._progress is not None:
            return
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.table import Column
        self._progress = Progress(
            SpinnerColumn(), TextColumn("[bold]{task.description}", table_column=Column(no_wrap=True)),
            BarColumn(bar_width=20), TextColumn("{task.fields[work]}", table_column=Column(no_wrap=True)),
            TimeElapsedColumn(), TextColumn("{task.fields[eta]}", table_column=Column(no_wrap=True)),
            # the latest output line takes what is left of the width, cut with an ellipsis (expand + ratio)
            TextColumn("{task.fields[detail]}", style="dim", markup=False,
                       table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
            console=self.out, transient=True, redirect_stdout=False, redirect_stderr=False,
            refresh_per_second=4, expand=True)
        self._progress.start()

    def _update(self, *, cell: int | None = None, detail: str | None = None) -> None:
        work = self._work
        if cell is not None:
            cells = f"cell {cell}/{self._cells}" if self._cells else f"cell {cell}"
        fields: dict = {}
        if work is not None:
            fields["work"] = f"{work.done}/{work.total} {work.unit}".rstrip()
            eta = work.eta()
            fields["eta"] = f"eta {duration(eta)}" if eta is not None else ""
        elif cell is not None:
            fields["work"], fields["eta"] = cells, ""
        if detail is not None:
            fields["detail"] = self.redact(detail)[:300]
        if self.live and self._task is not None:
            if work is not None:
                self._progress.update(self._task, total=100, completed=work.pct, **fields)
            elif cell is not None:
                self._progress.update(self._task, total=self._cells or None, completed=max(cell - 1, 0), **fields)
            else:
                self._progress.update(self._task, **fields)
        elif not self.live and work is not None and time.monotonic() >= self._plain_next:
            now = time.monotonic()
            # the next after 4x the time so far: 1, 4, 16, 64 min into the step (a few lines for hours of work,
            # one for a phase of minutes)
            self._plain_next = now + max(PLAIN_EVERY_S, 3 * (now - self._started))
            what = f"{work.label} " if work.label else ""
            self._print(f"{self._step}: {what}{work.pct:.0f}% {fields['work']}"
                        + (f", {fields['eta']}" if fields["eta"] else ""))

    def step_done(self, result: StepResult, rows: Iterable[Check] = (), where: str = "") -> None:
        """The step's line (status, time, counts), then each failing and warning row in full with its fix, and
        for a failure its error and where its notebook is kept."""
        with self._lock:
            self.results.append(result)
            ok = result.status == "passed"
            self.failing.append((result.name, [r for r in rows if r.status is Status.FAIL]))
            counts = count_text(result.counts)
            line = f"{result.name}: {result.status} in {duration(result.seconds)}" + (f" ({counts})" if counts else "")
            self._append([line])
            self._print(("✓ " if self.live and ok else "✗ " if self.live else "") + line,
                        style="green" if ok else "bold red")
            shown = [r for s in SHOWN for r in rows if r.status is s]
            for row in shown:
                text = "  " + row_text(row).replace("\n", "\n  ")
                self._append(text.splitlines())
                self._print(text, style="red" if row.status is Status.FAIL else "yellow")
            if not ok and result.error and not any(r.status is Status.FAIL for r in shown):
                self._append([f"  {result.error}"])
                self._print(f"  {result.error}", style="red")
            if not ok and where:
                self._append([f"  the executed notebook: {where}"])
                self._print(f"  the executed notebook: {where}")

    # ------------------------------------------------------------------ the end
    def first_fix_text(self) -> str:
        """The one fix to do first (:func:`runbook.checks.first_fix` over the failing rows shown), "" when no row
        failed (the step's error then stands alone)."""
        ranked = first_fix(self.failing)
        if ranked is None:
            return ""
        step, row = ranked
        where = f"{step} · {row.name}" + (f" on {row.node}" if row.node else "")
        return f"first fix ({where}): {row.fix or 'the row names no fix: read it above'}"

    def report(self, path: Path | None, verdict: str = "", problem: str = "") -> None:
        """Where the report is (printed last by ``finish``); ``problem``: why it was not written."""
        self.report_path, self.report_verdict = path, verdict
        if problem:
            self.say(f"report: not written ({problem})")

    def close(self) -> None:
        with self._lock:
            if self._progress is not None:
                self._progress.stop()
                self._progress = None

    def finish(self, verdict: str, *, extra: Iterable[str] = ()) -> None:
        """The summary table, the verdict in one line, the report's path (last)."""
        from rich import box
        from rich.table import Table
        self.close()
        with self._lock:
            if self.results:
                header = ("step", "status", "time", "checks")
                rows = [(r.name, r.status, duration(r.seconds), count_text(r.counts) or "-") for r in self.results]
                plain = plain_table([header, *rows])
                self._append([""] + plain)
                if self.live:
                    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
                    for col in header:
                        table.add_column(col, no_wrap=col != "checks")
                    for r, cells in zip(self.results, rows):
                        table.add_row(*cells, style="green" if r.status == "passed" else "red")
                    self.out.print()
                    self.out.print(table)
                else:
                    for line in [""] + plain:
                        self._print(line)
            for line in [verdict, *extra]:
                self._append([line])
                self._print(line, style="bold")
            if self.report_path is not None:
                line = f"report: {shorter(self.report_path)}"
                self._append([line])
                self._print(line)

    # ------------------------------------------------------------------ other output of this process
    def logging_handler(self) -> logging.Handler:
        """A handler that sends records to the full stream (papermill's cell output, library warnings)."""
        console = self

        class ToConsole(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    console.detail(record.getMessage())
                except Exception:  # noqa: BLE001 - a log line must never end the run
                    self.handleError(record)
        return ToConsole()

    @contextlib.contextmanager
    def capture_stdio(self) -> Iterator[None]:
        """While a run goes: prints of this process (the lab's ``[lab]`` lines) and log records go to the full
        stream instead of breaking the live line."""
        root = logging.getLogger()
        saved = root.handlers[:]
        handler = self.logging_handler()
        root.handlers = [handler]
        out, err = LineWriter(self.detail), LineWriter(self.detail)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                yield
        finally:
            out.flush_line()
            err.flush_line()
            root.handlers = saved
            self.close()

    @contextlib.contextmanager
    def follow_file(self, path: Path, every_s: float = 0.2, *, counts: bool = False) -> Iterator[None]:
        """Lines appended to ``path`` (the kernel's stdout and stderr) go to the full stream as they come.
        ``counts``: the file of the kernel's counts (``runbook.progress``): they only move the live line (the
        final counts reach the full stream with the cell's output)."""
        stop = threading.Event()
        path = Path(path)

        def pump(fh) -> None:
            partial = ""
            while True:
                chunk = fh.read()
                if chunk:
                    partial += chunk
                    *lines, partial = partial.split("\n")
                    for line in lines:
                        self.counted(line) if counts else self.detail(line, moves=False)
                elif stop.is_set():
                    break
                else:
                    stop.wait(every_s)
            if partial:
                self.counted(partial) if counts else self.detail(partial, moves=False)

        fh = path.open("r", encoding="utf-8", errors="replace")
        thread = threading.Thread(target=pump, args=(fh,), name="console-follow", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=10)
            fh.close()


def shorter(path: Path | str) -> str:
    """A path relative to the working directory when it lies below it (``results/<run>/report.html``)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def plain_table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as aligned plain lines (no trailing spaces)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]


class LineWriter(io.TextIOBase):
    """A text stream that hands each complete line to ``sink``; the part after the last break waits for the next
    write (``flush_line``/``close`` hand it on). ``breaks``: the regex that ends a line -- ``\n`` for captured output,
    ``\r\n|\r|\n`` for a tool whose progress redraws with ``\r`` (rsync, dd: ``remote.Node.run(lines=)``)."""

    def __init__(self, sink: Callable[[str], None], breaks: str = r"\n"):
        super().__init__()
        self.sink, self.partial, self.breaks = sink, "", re.compile(breaks)

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.partial = self.breaks.split(self.partial + text)
        for line in lines:
            self.sink(line)
        return len(text)

    def flush_line(self) -> None:
        if self.partial:
            self.sink(self.partial)
            self.partial = ""

    def close(self) -> None:
        self.flush_line()
        super().close()
