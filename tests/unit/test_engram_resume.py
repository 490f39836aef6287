"""Interrupted Engram packs resume from the last recorded row, for real: a tmpfs that fills up
mid-write and is then grown (``mount -o remount,size=``), a packer process killed with SIGKILL or
stopped with SIGTERM, and the step's command-line path (``step.run_pack`` running ``python3
pack.py`` under bash, as on a node). Every resumed file is compared byte for byte with a pack done
in one go."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from runbook import progress
from runbook.checks import Status
from runbook.engram_tools import layout as L
from runbook.engram_tools import pack_partial, pack_writer, synth
from runbook.engram import packing as step
from runbook.engram.facts import gather_facts
from runbook.engram.precheck import precheck
from runbook.engram_tools.ship import TOOL_FILES
from support.counts import assert_rising_to_the_end, seeing
from support.doubles import FakeCluster, LocalNode
from support.engram import PY, expected_file, run_tool, tool_node
from support.profiles import profile_from

ENGRAM_DIR = Path(L.__file__).resolve().parent
RB = 264


@pytest.fixture(scope="module")
def tools(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tools")
    for name in TOOL_FILES:
        shutil.copy(ENGRAM_DIR / name, d / name)
    return d


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """vocab 2000: layer 1 rank 0 of TP=2 is 24,562 rows = 6,488,464 bytes packed."""
    d = tmp_path_factory.mktemp("src")
    synth.make_source(str(d), vocab_size=2000)
    return d


@pytest.fixture(scope="module")
def big_src(tmp_path_factory) -> Path:
    """vocab 4000, layer 1 only: 97,968 rows = 25.9 MB packed at TP=1 (long enough to be killed)."""
    d = tmp_path_factory.mktemp("bigsrc")
    synth.make_source(str(d), vocab_size=4000, write_layers=[1])
    return d


@pytest.fixture
def tmpfs(tmp_path):
    """A real 4 MiB tmpfs, grown with ``resize(bytes)``; unmounted at the end."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root: these tests fill a real filesystem")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                         capture_output=True, text=True, timeout=30)
    if res.returncode:
        pytest.skip(f"mount -t tmpfs is not permitted here: {res.stderr.strip()}")

    def resize(nbytes: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={nbytes}", str(mnt)], check=True,
                       capture_output=True, timeout=30)

    try:
        yield SimpleNamespace(path=mnt, resize=resize)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def used_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def rank_range(src: Path, layer: int, rank: int, tp: int) -> L.RankRange:
    return L.EngramLayout.from_config(L.load_config(str(src)), tp).rank_range(layer, rank)


def record_of(final: Path) -> dict:
    return json.loads(Path(f"{final}.partial.json").read_text())


def direct_works(directory: Path) -> bool:
    probe = directory / ".odirect-probe"
    probe.write_bytes(b"")
    try:
        fd = pack_writer.open_direct(str(probe))
        if fd is not None:
            os.close(fd)
        return fd is not None
    finally:
        probe.unlink()


def test_disk_full_mid_write_then_grown_resumes_and_counts_only_the_rest(tools, src, tmpfs, tmp_path):
    mnt = tmpfs.path
    rr = rank_range(src, 1, 0, 2)
    final = mnt / rr.file_name
    args = ("--src", src, "--out", mnt, "--tp", 2, "--rank", 0, "--layers", 1)
    assert rr.packed_bytes > 4 << 20                         # does not fit the 4 MiB tmpfs
    # 1. the disk fills mid-write (past the pre-check), with the default --sync-mib 256: no periodic
    #    sync happened before ENOSPC, so the rows must be recorded on the way out
    _, summary, _ = run_tool(tools, "pack.py", *args, "--skip-space-check", "--chunk-rows", 1024, expect=3)
    rows = summary["rows_done"]
    assert "disk full" in summary["error"] and 0 < rows < rr.rows and rows % 1024 == 0, summary
    kept = L.HEADER_BYTES + rows * RB
    remaining = rr.packed_bytes - kept
    assert summary["need_bytes"] == remaining and summary["dir"] == str(mnt)
    assert f"{remaining} bytes" in summary["error"] and str(mnt) in summary["error"]
    assert f"resumes from row {rows}" in summary["error"]
    assert not final.exists()                                # nothing half-written under the final name
    partial = Path(f"{final}.partial")
    assert partial.stat().st_size == kept                    # the torn chunk was dropped
    assert record_of(final)["rows_done"] == rows

    # 2. grown, but not enough for the rest: refused, naming the dir and the bytes still to write
    tmpfs.resize(used_bytes(mnt) + remaining // 2)
    before = (partial.stat().st_mtime_ns, Path(f"{partial}.json").read_bytes())
    _, summary, _ = run_tool(tools, "pack.py", *args, expect=3)
    assert summary["need_bytes"] == remaining and summary["kept_bytes"] == kept, summary
    assert summary["free_bytes"] < remaining
    assert f"not enough free space in {mnt}: need {remaining} bytes" in summary["error"]
    assert f"{kept} bytes of it are in .partial files already" in summary["error"]
    assert (partial.stat().st_mtime_ns, Path(f"{partial}.json").read_bytes()) == before   # untouched

    # the step's pre-check (gather_facts over a node, then precheck) says the same
    cluster = FakeCluster([tool_node("head", 0)])
    prof = profile_from("env/lab.env", ENGRAM_SRC_DIR=src, ENGRAM_PACKED_DIR=mnt, ENGRAM_GIB=0)   # head only here
    facts = gather_facts(cluster, prof)
    space = next(c for c in precheck(prof, facts, layers=[1]) if c.name == "engram packed dir free space")
    assert space.status is Status.FAIL and space.data["need_bytes"] == remaining, space
    assert space.data["partial_kept_bytes"] == kept and str(mnt) in space.observed and "free" in space.fix

    # 3. grown to hold the rest, still less than the whole file: the whole-file count would refuse
    tmpfs.resize(used_bytes(mnt) + remaining + (64 << 10))
    assert remaining < free_bytes(mnt) < rr.packed_bytes
    facts = gather_facts(cluster, prof)
    space = next(c for c in precheck(prof, facts, layers=[1]) if c.name == "engram packed dir free space")
    assert space.status is Status.PASS and space.data["need_bytes"] == remaining, space
    journal_missing = sum(4096 for x in (".partial.json", ".partial.json.next") if not Path(f"{final}{x}").exists())
    t0 = time.monotonic()
    _, summary, log = run_tool(tools, "pack.py", *args, "--chunk-rows", 1536)   # another chunk size: still aligned
    resume_s = time.monotonic() - t0
    (entry,) = summary["files"]
    assert entry["status"] == "resumed" and entry["resumed_from_row"] == rows > 0, entry
    assert entry["bytes_written"] == remaining and summary["space"]["need_bytes"] == remaining + journal_missing
    assert summary["space"]["kept_bytes"] == kept
    if direct_works(mnt):                                    # O_DIRECT from a mid-file row: still page aligned
        assert entry["direct_bytes"] > 0 and entry["direct_bytes"] % 4096 == 0, entry
        assert "O_DIRECT write refused" not in log
    assert sorted(os.listdir(mnt)) == [rr.file_name]        # no partial, no record left

    once = tmp_path / "once"
    t0 = time.monotonic()
    run_tool(tools, "pack.py", "--src", src, "--out", once, "--tp", 2, "--rank", 0, "--layers", 1)
    full_s = time.monotonic() - t0
    assert final.read_bytes() == (once / rr.file_name).read_bytes() == expected_file(src, 1, 0, 2)
    print(f"[engram resume] tmpfs: resumed at row {rows}/{rr.rows} in {resume_s:.3f} s; whole pack {full_s:.3f} s")


def _start_packer(tools: Path, big_src: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([PY, "-I", str(tools / "pack.py"), "--src", str(big_src), "--out", str(out),
                             "--tp", "1", "--rank", "0", "--layers", "1", "--chunk-rows", "512",
                             "--sync-mib", "0", "--progress-every", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tools)


def _wait_for_recorded_rows(proc: subprocess.Popen, final: Path, at_least: int) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            rows = record_of(final)["rows_done"]
        except (OSError, ValueError, KeyError):
            rows = 0
        if rows >= at_least:
            return rows
        assert proc.poll() is None, f"packer ended before any progress was recorded: {proc.communicate()}"
        time.sleep(0.002)
    raise AssertionError("no progress recorded within 60 s")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_or_stopped_packer_process_resumes_identical(tools, big_src, tmp_path, sig):
    rr = rank_range(big_src, 1, 0, 1)
    out = tmp_path / "out"
    final = out / rr.file_name
    proc = _start_packer(tools, big_src, out)
    try:
        seen = _wait_for_recorded_rows(proc, final, rr.rows // 3)          # mid-way
        assert proc.poll() is None, "the packer finished before it could be interrupted: use a bigger table"
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rows = record_of(final)["rows_done"]
    partial = Path(f"{final}.partial")
    assert not final.exists() and partial.exists()
    assert seen <= rows < rr.rows
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
        assert partial.stat().st_size >= L.HEADER_BYTES + rows * RB    # unrecorded bytes may follow
    else:                                                    # SIGTERM: chunk in hand written, recorded
        assert proc.returncode == 128 + signal.SIGTERM, stderr
        summary = json.loads(stdout.strip().splitlines()[-1])
        assert summary["exit_code"] == 143 and "stopped by SIGTERM" in summary["error"]
        assert summary["rows_done"] == rows and f"resumes from row {rows}" in summary["error"]
        assert partial.stat().st_size == L.HEADER_BYTES + rows * RB

    t0 = time.monotonic()
    _, summary, _ = run_tool(tools, "pack.py", "--src", big_src, "--out", out, "--tp", 1, "--rank", 0,
                             "--layers", 1, subprocess_=True)
    resume_s = time.monotonic() - t0
    (entry,) = summary["files"]
    assert entry["status"] == "resumed" and entry["resumed_from_row"] == rows > 0, entry
    assert entry["bytes_written"] == (rr.rows - rows) * RB
    once = tmp_path / "once"
    t0 = time.monotonic()
    run_tool(tools, "pack.py", "--src", big_src, "--out", once, "--tp", 1, "--rank", 0, "--layers", 1,
             subprocess_=True)
    full_s = time.monotonic() - t0
    assert final.read_bytes() == (once / rr.file_name).read_bytes()
    assert final.read_bytes()[4096:] == expected_file(big_src, 1, 0, 1)[4096:]
    assert sorted(os.listdir(out)) == [rr.file_name]
    print(f"[engram resume] {sig.name}: resumed at row {rows}/{rr.rows} in {resume_s:.3f} s; "
          f"whole pack {full_s:.3f} s (both with interpreter start)")


def test_resume_through_the_step_command_line(tools, src, tmpfs):
    """step.run_pack runs ``python3 <tools>/pack.py ...`` and ``check.py`` under bash, like a node:
    disk full mid-write -> a failed row with the space fix; the pre-check then counts the kept rows;
    after the disk grows the re-run resumes and verifies."""
    mnt = tmpfs.path
    cluster = FakeCluster([LocalNode("head", 0)])        # every command a real process, nothing in-process
    prof = profile_from("env/lab.env", ENGRAM_SRC_DIR=src, ENGRAM_PACKED_DIR=mnt, ENGRAM_GIB=0)   # head only here
    rr = rank_range(src, 1, 0, 2)
    tdir = str(tools.parent / "step-tools")
    results: dict = {}
    checks = step.run_pack(cluster, prof, tools_dir=tdir, layers=[1], results=results,
                           extra_args=["--skip-space-check", "--chunk-rows", "1024"])
    (bad,) = checks.failures()
    pack_result = results["head"]["pack"]
    rows = pack_result["rows_done"]
    assert pack_result["exit"] == 3 and 0 < rows < rr.rows, pack_result
    assert bad.name == "engram pack" and "disk full" in bad.observed and bad.fix == step.EXIT_FIX[3]
    assert "python3" in pack_result["command"] and "--skip-space-check" in pack_result["command"]

    tmpfs.resize(8 << 20)
    facts = gather_facts(cluster, prof)
    kept = L.HEADER_BYTES + rows * RB
    assert facts["head"]["packed_records"][rr.file_name]["rows_done"] == rows
    space = next(c for c in precheck(prof, facts, layers=[1]) if c.name == "engram packed dir free space")
    assert space.status is Status.PASS and space.data["partial_kept_bytes"] == kept
    assert space.data["need_bytes"] == rr.packed_bytes - kept and "kept in .partial" in space.observed

    results = {}
    checks = step.run_pack(cluster, prof, facts, tools_dir=tdir, layers=[1], results=results)
    assert not checks.failures(), checks.to_text()
    row = next(c for c in checks if c.name == "engram pack L1")
    assert row.status is Status.PASS and row.data["status"] == "resumed"
    assert row.data["resumed_from_row"] == rows and f"from row {rows}" in row.observed
    assert next(c for c in checks if c.name == "engram packed L1 verify").status is Status.PASS
    assert (mnt / rr.file_name).read_bytes() == expected_file(src, 1, 0, 2)
    assert step.summarize(results)["head"]["pack"]["files"][rr.file_name]["resumed_from_row"] == rows


def _stopped_partial(tools: Path, src: Path, out: Path, chunks: int) -> Path:
    """A partial left by a hard exit after ``chunks`` chunks of 512 rows (layer 14, rank 1 of 2)."""
    code, _, _ = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 1, "--layers", 14,
                          "--chunk-rows", 512, "--sync-mib", 0, "--stop-after-chunks", chunks, expect=None,
                          subprocess_=True)
    assert code == pack_partial.EXIT_TEST_STOP
    final = out / L.packed_name(14, 1, 2)
    assert record_of(final)["rows_done"] == chunks * 512
    return final


def test_unaligned_record_resumes_on_a_page_aligned_row(tools, src, tmp_path):
    out = tmp_path / "align"
    final = _stopped_partial(tools, src, out, 4)
    rec_path = Path(f"{final}.partial.json")
    rec = record_of(final)
    rec["rows_done"] = 2000                                  # not a multiple of 512 rows (= 33 pages)
    rec_path.write_text(json.dumps(rec))
    _, summary, log = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 1,
                               "--layers", 14, "--chunk-rows", 1024)
    (entry,) = summary["files"]
    assert entry["resumed_from_row"] == 1536 and "O_DIRECT write refused" not in log
    if direct_works(out):
        assert entry["direct_bytes"] > 0 and entry["direct_bytes"] % 4096 == 0
    assert final.read_bytes() == expected_file(src, 14, 1, 2)


def test_partial_whose_recorded_rows_changed_is_redone(tools, src, tmp_path):
    out = tmp_path / "changed"
    final = _stopped_partial(tools, src, out, 3)
    partial = Path(f"{final}.partial")
    with open(partial, "r+b") as f:                          # flip a byte in the last recorded row
        f.seek(L.HEADER_BYTES + (3 * 512 - 1) * RB + 7)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    _, summary, log = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 1,
                               "--layers", 14)
    assert summary["files"][0]["status"] == "packed" and summary["files"][0]["resumed_from_row"] == 0
    assert "differ from the source" in log and "redoing it from row 0" in log
    assert final.read_bytes() == expected_file(src, 14, 1, 2)


def test_second_packer_on_a_locked_partial_is_refused_and_changes_nothing(tools, src, tmp_path):
    out = tmp_path / "locked"
    final = _stopped_partial(tools, src, out, 2)
    partial = Path(f"{final}.partial")
    before = (partial.read_bytes(), Path(f"{partial}.json").read_bytes())
    fd = os.open(partial, os.O_RDWR)                          # the "other packer" holds the lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _, summary, _ = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 1,
                                 "--layers", 14, expect=pack_partial.EXIT_BUSY)
    finally:
        os.close(fd)
    assert "another engram pack is writing" in summary["error"] and str(partial) in summary["error"]
    assert (partial.read_bytes(), Path(f"{partial}.json").read_bytes()) == before
    (c,) = step.pack_checks("head", summary, pack_partial.EXIT_BUSY)
    assert c.status is Status.FAIL and "fuser" in c.fix
    _, summary, _ = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 1, "--layers", 14)
    assert summary["files"][0]["resumed_from_row"] == 1024
    assert final.read_bytes() == expected_file(src, 14, 1, 2)


def test_the_packers_progress_lines_reach_the_progress_channel(tools, src, tmp_path):
    """Issue 38 item 2: run_pack(stream=True) relays the real packer's counting lines into runbook.progress as
    ``<node> [engram-pack] <file>``: counts that rise and end at the file's size; its other lines are still echoed."""
    with seeing() as seen:
        cluster = FakeCluster([LocalNode("head", 0)])
        prof = profile_from("env/lab.env", ENGRAM_SRC_DIR=src, ENGRAM_PACKED_DIR=tmp_path / "packed", ENGRAM_GIB=0)
        rr = rank_range(src, 1, 0, 2)
        checks = step.run_pack(cluster, prof, tools_dir=str(tools.parent / "relay-tools"), layers=[1], stream=True,
                               progress_every=1, extra_args=["--skip-space-check", "--chunk-rows", "2048"])
        finals = progress.finals()
    assert not checks.failures(), checks.to_text()
    shown = [s for s in seen.shown if s[0] == f"head [engram-pack] {rr.file_name}"]
    assert len(shown) > 2, seen.shown
    assert_rising_to_the_end(shown)
    assert finals[f"head [engram-pack] {rr.file_name}"]["ended"]
