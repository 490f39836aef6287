"""The one progress channel (issue 38 item 2, ``runbook.progress``): one wire line, counts that never go back and
are shown at most every EVERY_S, the faces (the console's live line on a terminal, a few plain lines in a pipe,
an ipywidgets bar in a kernel), the final counts in the step's sidecar."""
from __future__ import annotations

import io
import json
import re

import pytest

from runbook import console as console_mod
from runbook import progress
from runbook.console import Console
from runbook.weights_tools import node_download
from support.counts import assert_rising_to_the_end, seeing


@pytest.fixture
def seen():
    with seeing() as sink:
        yield sink


# ---------------------------------------------------------------------------------------------- the wire line
@pytest.mark.parametrize("args, text", [
    (("head weights download", 3 * 2 ** 29, 3 * 2 ** 30, "B"), "head weights download:  50.0% 1.50/3.00 GiB"),
    (("ranks up", 1, 3, "ranks"), "ranks up:  33.3% 1/3 ranks"),
    (("ready wait", 12.5, 600, "s"), "ready wait:   2.1% 12.5/600.0 s"),
    (("image load", 512, 2048, "B"), "image load:  25.0% 0.50/2.00 KiB"),
])
def test_a_count_is_one_line_and_reads_back(args, text):
    assert progress.line(*args) == text
    back = progress.parse(text + " eta 3s")
    assert (back.label, back.done_text, back.eta_s) == (args[0], text.split()[-2].split("/")[0], 3.0)


def test_the_node_tools_print_the_same_line():
    """The packer and the downloader run on a node without the runbook; their lines read back as counts."""
    packer = progress.parse("[pack] engram-tp0.bin:  45.0% 1.20/2.70 GiB 512 MB/s eta 3s")
    assert (packer.label, packer.done, packer.total, packer.unit, packer.eta_s) == \
        ("[pack] engram-tp0.bin", 1.2, 2.7, "GiB", 3.0)
    counts = node_download.Counts("weights download", {"a": 2 ** 30}, 4 * 2 ** 30, stream=io.StringIO())
    got = progress.parse(counts.line(2 ** 31))
    assert (got.label, got.pct, got.done, got.total, got.unit) == ("weights download", 50.0, 2.0, 4.0, "GiB")
    assert progress.parse("bench: 3 cases done") is None and progress.parse('{"ok": true, "seconds": 1.5}') is None


# ---------------------------------------------------------------------------------------------- counting
def test_counts_never_go_back_and_are_throttled(seen):
    with progress.count("weights download head", 1000, "B", every_s=3600) as bar:
        for done in range(0, 1001, 10):
            bar.update(done)
        bar.update(500)                       # a retry from byte 0 does not count back
    shown = seen.of("weights download head")
    # the first update, the one reaching the total, the end: nothing per tick in between
    assert [(s[1], s[3]) for s in shown] == [(0.0, False), (1000.0, False), (1000.0, True)]
    assert_rising_to_the_end(shown)
    final = progress.finals()["weights download head"]
    assert (final["done"], final["total"], final["unit"], final["ended"]) == (1000.0, 1000.0, "B", True)


def test_without_throttle_every_update_is_shown(seen):
    with progress.count("requests", 5, "requests", every_s=0) as bar:
        for _ in range(5):
            bar.advance()
    assert [s[1] for s in seen.of("requests")] == [1, 2, 3, 4, 5, 5]


def test_a_negative_total_is_refused():
    with pytest.raises(ValueError, match="total -1"):
        progress.count("x", -1)


def test_relay_turns_a_tools_lines_into_counts_and_echoes_the_rest(seen):
    echoed = []
    with progress.relay("worker ", echo=echoed.append) as relay:
        for line in ["engram-pack: start", "[pack] t0.bin:   0.0% 0.00/2.00 GiB", "[pack] t0.bin:  50.0% 1.00/2.00 GiB",
                     "[pack] t0.bin:  40.0% 0.80/2.00 GiB", "[pack] t0.bin: 100.0% 2.00/2.00 GiB", '{"ok": true}']:
            relay(line)
    assert echoed == ["engram-pack: start", '{"ok": true}']
    assert_rising_to_the_end(seen.of("worker [pack] t0.bin"))


# ---------------------------------------------------------------------------------------------- the faces
def test_under_the_runner_counts_go_to_the_file_the_console_follows(tmp_path, monkeypatch):
    path = tmp_path / "progress.log"
    path.touch()
    monkeypatch.setenv(progress.FILE_ENV, str(path))
    progress.use(None)
    try:
        assert isinstance(progress.sink(), progress.FileSink)
        with progress.count("ship worker", 4 * 2 ** 20, "B", every_s=0) as bar:
            bar.update(2 ** 21)
            bar.update(4 * 2 ** 20)
    finally:
        progress.use(None)
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and lines[0].startswith("ship worker:  50.0% 2.00/4.00 MiB")
    assert re.match(r"ship worker: 100\.0% 4\.00/4\.00 MiB in \d+\.\ds$", lines[-1])


def _plain_console(monkeypatch):
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    buf = io.StringIO()
    return Console(file=buf), buf


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_piped_a_long_count_says_where_it_is_a_few_times_not_per_tick(monkeypatch):
    """Plain lines after 1 min, then at 4x the time so far: two hours of ticks every second make four lines, a
    phase of three minutes one."""
    console, buf = _plain_console(monkeypatch)
    clock = Clock()
    monkeypatch.setattr(console_mod.time, "monotonic", clock)
    with console.step("02_weights", cells=8):
        for second in range(0, 7200, 1):
            clock.now = 1000.0 + second
            console.counted(progress.line("head weights download", second, 7200, "s"))
    lines = buf.getvalue().splitlines()
    assert lines[0] == "02_weights: running"
    said = lines[1:]
    assert said and all(line.startswith("02_weights: head weights download ") and "/7200.0 s" in line
                        for line in said), said
    assert [line.split()[5] for line in said] == ["60.0/7200.0", "240.0/7200.0", "960.0/7200.0", "3840.0/7200.0"]
    assert "\x1b" not in buf.getvalue()


def test_piped_a_phase_of_minutes_adds_one_line(monkeypatch):
    console, buf = _plain_console(monkeypatch)
    clock = Clock()
    monkeypatch.setattr(console_mod.time, "monotonic", clock)
    with console.step("04_launch", cells=8):
        for second in range(0, 200):
            clock.now = 1000.0 + second
            console.counted(progress.line("ready wait", second, 600, "s"))
    assert buf.getvalue().splitlines() == ["04_launch: running", "04_launch: ready wait 10% 60.0/600.0 s"]


def test_piped_a_short_count_adds_no_line(monkeypatch):
    console, buf = _plain_console(monkeypatch)
    with console.step("04_launch", cells=8):
        for up in range(3):
            console.counted(progress.line("ranks up", up + 1, 3, "ranks"))
    assert buf.getvalue().splitlines() == ["04_launch: running"]


def test_on_a_terminal_the_live_line_shows_the_bar_and_eta(monkeypatch):
    for name in ("NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    buf = io.StringIO()
    console = Console(file=buf)
    assert console.live
    with console.step("02_weights", cells=8):
        console.counted("head weights download:  45.0% 1.20/2.70 GiB eta 30s")
        task = console._progress.tasks[0]
        assert (task.completed, task.total) == (45.0, 100)
        assert task.fields["work"] == "1.20/2.70 GiB" and task.fields["eta"] == "eta 30.0 s"
        assert task.fields["detail"] == "head weights download"
        console._progress.refresh()
    console.close()
    assert "━" in buf.getvalue() and "1.20/2.70 GiB" in buf.getvalue()


def test_no_color_on_a_terminal_draws_the_bar_without_colour(monkeypatch):
    for name in ("TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("NO_COLOR", "1")
    buf = io.StringIO()
    console = Console(file=buf)
    with console.step("02_weights", cells=8):
        console.counted("head weights download:  45.0% 1.20/2.70 GiB eta 30s")
        console._progress.refresh()
    console.close()
    assert "1.20/2.70 GiB" in buf.getvalue()
    assert not re.search(r"\x1b\[[0-9;]*(3[0-9]|9[0-7])[0-9;]*m", buf.getvalue()), repr(buf.getvalue())


def test_outside_a_kernel_and_the_runner_a_short_count_prints_nothing(capsys):
    sink = progress.StreamSink()
    with progress.count("ready wait", 600, "s", every_s=0, to=sink) as bar:
        for s in range(10):
            bar.update(s)
    assert capsys.readouterr().err == ""


def test_the_step_sidecar_keeps_the_final_counts_masked(tmp_path, monkeypatch, seen):
    from runbook import step as step_mod
    monkeypatch.setenv("RUNBOOK_SECRETS_FILE", str(tmp_path / "none.env"))
    with progress.count("left from an earlier step", 5, "B") as bar:
        bar.update(5)
    step = step_mod.begin("02_weights", "env/lab.env", results_root=tmp_path / "results")
    step.run.redactor.add("hf_sidecarsecret123")
    with progress.count("head weights download hf_sidecarsecret123", 10, "B") as bar:
        bar.update(10)
    step.finish(display=False)
    text = (step.run.path / step.run.sidecar_rel(step.name)).read_text()
    assert "hf_sidecarsecret123" not in text
    counted = json.loads(text)["data"]["progress"]
    (label,) = counted                          # this step's count only
    assert label.startswith("head weights download ")
    assert {k: counted[label][k] for k in ("done", "total", "unit", "ended")} == \
        {"done": 10, "total": 10, "unit": "B", "ended": True}


# ---------------------------------------------------------------------------------------------- in a notebook
COUNTING_CELL = ("from runbook import progress\n"
                 "with progress.count('weights download head', 3 * 2 ** 20, 'B', every_s=0) as bar:\n"
                 "    for done in (2 ** 20, 2 ** 21, 3 * 2 ** 20):\n"
                 "        bar.update(done)")


def test_in_a_notebook_a_count_is_a_progress_widget_and_its_end_a_line(tmp_path, monkeypatch):
    """Run by hand (nbclient, as JupyterLab runs a cell): an ipywidgets bar in the cell's output, its last state
    kept with the notebook, and the final counts as a line an archived notebook shows without widgets."""
    import nbformat
    from nbclient import NotebookClient
    monkeypatch.delenv(progress.FILE_ENV, raising=False)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(COUNTING_CELL)]
    nb.metadata["kernelspec"] = {"name": "runbook", "display_name": "Python (runbook)", "language": "python"}
    NotebookClient(nb, timeout=120, kernel_name="runbook", store_widget_state=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[0].outputs
    views = [o for o in outputs if o.output_type == "display_data"
             and "application/vnd.jupyter.widget-view+json" in o.data]
    assert len(views) == 1, outputs                       # one bar, updated in place (not one per update)
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert re.fullmatch(r"weights download head: 100\.0% 3\.00/3\.00 MiB in \d+\.\ds\n", text), text
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    bars = [m["state"] for m in state.values() if m["model_name"] == "FloatProgressModel"]
    assert [(b["value"], b["bar_style"], b["description"]) for b in bars] == \
        [(100.0, "success", "weights download head")]


def test_a_wait_has_no_eta(seen):
    """Seconds waited of READY_TIMEOUT: the total is a limit, so no ETA (it would read as 'ready in …')."""
    with progress.count("ready wait", 600, "s", every_s=0) as bar:
        bar.update(30)
        assert bar.eta() is None
    first = console_mod.parse_work("ready wait:   5.0% 30.0/600.0 s", now=0.0)
    later = console_mod.parse_work("ready wait:  10.0% 60.0/600.0 s", first, now=30.0)
    assert later.eta() is None
    assert console_mod.parse_work("bytes:  10.0% 1.00/10.00 GiB", now=0.0).eta() is None       # one line: no rate
    with progress.count("files", 10, "files") as bar:
        bar.update(5)
        assert bar.eta() is None                 # one update: no rate yet (5 were done before it began)
        bar._first = (bar._first[0] - 10.0, 5)   # 10 s ago
        bar.update(7)
        assert bar.eta() == pytest.approx(3 * 10 / 2, rel=0.05)


def test_a_quiet_relay_drops_what_is_not_a_count(seen, capsys):
    with progress.relay("head ", quiet=True) as relay:
        relay('{"ok": true, "path": "/x"}')
        relay("weights download:  50.0% 1.00/2.00 GiB")
    assert capsys.readouterr().out == ""
    assert [s[0] for s in seen.shown] == ["head weights download", "head weights download"]


def test_outside_a_kernel_and_the_runner_a_long_count_says_where_it_is_a_few_times(monkeypatch):
    """A command in a terminal (``python -m runbook start``): after 30 s, then at 4x the time so far, and its end."""
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    err = io.StringIO()
    with progress.count("ready wait", 900, "s", every_s=0, to=progress.StreamSink(err)) as bar:
        for second in range(1, 600):
            clock.now = 1000.0 + second
            bar.update(second)
    lines = err.getvalue().splitlines()
    assert [line.split()[3] for line in lines] == ["30.0/900.0", "120.0/900.0", "480.0/900.0", "599.0/900.0"], lines
    assert lines[-1].endswith("in 599.0s")
