"""Packer/checker/probe on a small synthetic V4.1-style source, run the way the nodes run them:
the shipped scripts (``tools.TOOL_FILES``) copied alone into a directory and started with ``python3 -I``."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from runbook.engram_tools import layout as L
from runbook.engram_tools import pack_writer, synth
from runbook.engram_tools.ship import TOOL_FILES
from support.engram import ENGRAM_DIR, config, expected_file, run_tool, source_table

VOCAB = 2000                                           # ~50k rows/layer, ~13 MB per layer table


@pytest.fixture(scope="module")
def tools(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tools")
    for name in TOOL_FILES:         # exactly the shipped set: a module a tool imports but not shipped fails here
        shutil.copy(ENGRAM_DIR / name, d / name)
    return d


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("src")
    synth.make_source(str(d), vocab_size=VOCAB)
    return d


@pytest.mark.slow
def test_pack_tp2_both_ranks_byte_for_byte(tools, src, tmp_path):
    out = tmp_path / "packed"
    lay = L.EngramLayout.from_config(config(src), 2)
    for rank in (0, 1):
        _, summary, log = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", rank,
                                   "--chunk-rows", 4096, "--sync-mib", 8, "--progress-every", 2,
                                   subprocess_=True)
        assert summary["ok"] and summary["peak_rss_bytes"] > 0 and summary["bytes_written"] > 0
        assert "%" in log                                    # progress lines
        assert [f["status"] for f in summary["files"]] == ["packed", "packed"]
    for layer in (1, 14):
        table = source_table(src, layer)
        r0, r1 = lay.rank_ranges(layer)
        assert (r0.col_lo, r0.col_hi, r1.col_lo, r1.col_hi) == (0, 12, 12, 24)
        f0 = (out / L.packed_name(layer, 0, 2)).read_bytes()
        f1 = (out / L.packed_name(layer, 1, 2)).read_bytes()
        assert f0 == expected_file(src, layer, 0, 2) and f1 == expected_file(src, layer, 1, 2)
        assert f0[4096:] + f1[4096:] == table                # the two ranks cover [0, N) exactly
    assert sorted(os.listdir(out)) == sorted(L.packed_name(l, r, 2) for l in (1, 14) for r in (0, 1))
    for rank in (0, 1):
        _, res, _ = run_tool(tools, "check.py", "--src", src, "--packed", out, "--tp", 2, "--rank", rank,
                             "--samples", 64, subprocess_=rank == 0)
        assert res["ok"] and res["files"] and all(f["rows_checked"] >= 60 for f in res["files"])
    # a complete file is skipped and left untouched
    before = os.stat(out / L.packed_name(1, 0, 2)).st_mtime_ns
    _, summary, _ = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 0)
    assert [f["status"] for f in summary["files"]] == ["skipped", "skipped"]
    assert os.stat(out / L.packed_name(1, 0, 2)).st_mtime_ns == before


def test_direct_and_buffered_writes_give_the_same_bytes(tools, src, tmp_path):
    """Full chunks go through O_DIRECT where the filesystem takes it (tmp_path: the suite's disk);
    the short last chunk and --no-direct go buffered. Both must produce the exact file."""
    probe = tmp_path / "odirect-probe"
    probe.write_bytes(b"")
    direct_ok = pack_writer.open_direct(str(probe))
    if direct_ok is not None:
        os.close(direct_ok)
    outs = {}
    for mode in ("direct", "buffered"):
        out = tmp_path / mode
        flags = () if mode == "direct" else ("--no-direct",)
        _, summary, _ = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 1,
                                 "--layers", 14, "--chunk-rows", 1024, *flags, subprocess_=True)
        (entry,) = summary["files"]
        if mode == "buffered" or direct_ok is None:
            assert entry["direct_bytes"] == 0
        else:   # every full chunk direct; only the last, short one buffered
            assert 0 < entry["direct_bytes"] < entry["bytes_written"], entry
            assert entry["direct_bytes"] % 4096 == 0
        outs[mode] = (out / L.packed_name(14, 1, 2)).read_bytes()
    assert outs["direct"] == outs["buffered"] == expected_file(src, 14, 1, 2)


def test_direct_write_refused_mid_file_falls_back_to_buffered(tools, src, tmp_path, monkeypatch):
    """A filesystem that opens O_DIRECT but refuses the writes (EINVAL): the packer says so once,
    finishes buffered and the file is exact; the O_DIRECT descriptor is closed once, by pack()."""
    import errno as _errno
    opened, closed = [], []
    real_open_direct, real_write_all, real_close = pack_writer.open_direct, pack_writer.write_all, os.close

    def open_direct(path):
        fd = real_open_direct(path)
        if fd is None:
            pytest.skip("this filesystem refuses O_DIRECT at open")
        opened.append(fd)
        return fd

    def write_all(fd, view, off):
        if fd in opened:
            raise OSError(_errno.EINVAL, "Invalid argument")
        real_write_all(fd, view, off)

    def close(fd):
        if opened:                 # fd numbers are reused: count closes after the O_DIRECT open only
            closed.append(fd)
        real_close(fd)

    monkeypatch.setattr(pack_writer, "open_direct", open_direct)
    monkeypatch.setattr(pack_writer, "write_all", write_all)
    monkeypatch.setattr(pack_writer.os, "close", close)
    out = tmp_path / "fallback"
    _, summary, log = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 0,
                               "--layers", 1, "--chunk-rows", 1024)
    monkeypatch.undo()
    (entry,) = summary["files"]
    assert entry["direct_bytes"] == 0 and "O_DIRECT write refused" in log
    assert (out / L.packed_name(1, 0, 2)).read_bytes() == expected_file(src, 1, 0, 2)
    assert opened and all(closed.count(fd) == 1 for fd in opened), (opened, closed)


def test_pack_tp3_and_checker_catches_corruption(tools, src, tmp_path):
    out = tmp_path / "p3"
    run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 3, "--rank", 2, "--layers", 14)
    path = out / L.packed_name(14, 2, 3)
    assert path.read_bytes() == expected_file(src, 14, 2, 3)
    _, res, _ = run_tool(tools, "check.py", "--src", src, "--packed", out, "--tp", 3, "--rank", 2,
                         "--layers", 14)
    assert res["ok"]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF                                           # last row is always sampled
    path.write_bytes(bytes(data))
    _, res, _ = run_tool(tools, "check.py", "--src", src, "--packed", out, "--tp", 3, "--rank", 2,
                         "--layers", 14, expect=1)
    assert not res["ok"] and res["files"][0]["mismatched_rows"] == [L.EngramLayout.from_config(
        config(src), 3).num_rows(14) - 1]
    path.write_bytes(bytes(data[:-264]))                       # truncated
    _, res, _ = run_tool(tools, "check.py", "--src", src, "--packed", out, "--tp", 3, "--rank", 2,
                         "--layers", 14, expect=1)
    assert any("size" in p for p in res["files"][0]["problems"])
    # a wrong-size final file is repacked (replaced), not skipped
    _, summary, _ = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 3, "--rank", 2, "--layers", 14)
    assert summary["files"][0]["status"] == "replaced"
    assert path.read_bytes() == expected_file(src, 14, 2, 3)


def test_resume_after_killed_packer(tools, src, tmp_path):
    out = tmp_path / "resume"
    final = out / L.packed_name(1, 1, 2)
    args = ("--src", src, "--out", out, "--tp", 2, "--rank", 1, "--layers", 1, "--chunk-rows", 2048,
            "--sync-mib", 0)
    code, summary, _ = run_tool(tools, "pack.py", *args, "--stop-after-chunks", 3, expect=None,
                                subprocess_=True)
    assert code == 75                                          # hard exit mid-file, no cleanup
    assert not final.exists()
    partial = Path(str(final) + ".partial")
    record = json.loads(Path(str(partial) + ".json").read_text())
    assert record["rows_done"] == 3 * 2048
    # simulate a kill after more bytes reached the file than were synced: garbage past the record
    with open(partial, "ab") as f:
        f.write(b"\xAB" * 5000)
    _, summary, log = run_tool(tools, "pack.py", *args)
    entry = summary["files"][0]
    assert entry["status"] == "resumed" and entry["resumed_from_row"] == 3 * 2048
    assert entry["bytes_written"] == (entry["rows"] - 3 * 2048) * 264
    assert final.read_bytes() == expected_file(src, 1, 1, 2)
    assert not partial.exists() and not Path(str(partial) + ".json").exists()


def test_partial_without_valid_record_is_redone(tools, src, tmp_path):
    out = tmp_path / "redo"
    out.mkdir()
    final = out / L.packed_name(14, 0, 2)
    Path(str(final) + ".partial").write_bytes(b"\x00" * 10000)          # no record at all
    _, summary, log = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 0,
                               "--layers", 14)
    assert summary["files"][0]["status"] == "packed" and "redoing" in log
    assert final.read_bytes() == expected_file(src, 14, 0, 2)
    # a record from another source (different shard identity) is not trusted either
    code, _, _ = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 0, "--layers", 14,
                          "--chunk-rows", 1024, "--sync-mib", 0, "--stop-after-chunks", 2, "--progress-every", 0,
                          expect=None, subprocess_=True)
    assert code == 0                                            # complete file: skipped, hook never hit
    final.unlink()
    code, _, _ = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 0, "--layers", 14,
                          "--chunk-rows", 1024, "--sync-mib", 0, "--stop-after-chunks", 2, expect=None,
                          subprocess_=True)
    assert code == 75
    rec_path = Path(str(final) + ".partial.json")
    rec = json.loads(rec_path.read_text())
    rec["weight"]["mtime_ns"] += 1
    rec_path.write_text(json.dumps(rec))
    _, summary, _ = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 0, "--layers", 14)
    assert summary["files"][0]["status"] == "packed"
    assert final.read_bytes() == expected_file(src, 14, 0, 2)


@pytest.fixture
def small_fs(tmp_path):
    """A 4 MiB tmpfs (root only); cleaned up."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode:
        pytest.skip(f"cannot mount tmpfs: {res.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_disk_full_never_leaves_a_final_file(tools, src, small_fs):
    final = small_fs / L.packed_name(1, 0, 2)                 # ~6.5 MB > 4 MiB
    code, summary, log = run_tool(tools, "pack.py", "--src", src, "--out", small_fs, "--tp", 2, "--rank", 0,
                                  "--layers", 1, expect=3)
    assert "need" in summary["error"] and "free" in summary["error"] and "bytes" in summary["error"]
    assert not final.exists() and os.listdir(small_fs) == []  # refused before writing anything
    # bypass the pre-check: the disk fills mid-write -> exit 3, still nothing under the final name
    code, summary, log = run_tool(tools, "pack.py", "--src", src, "--out", small_fs, "--tp", 2, "--rank", 0,
                                  "--layers", 1, "--skip-space-check", "--chunk-rows", 1024, expect=3)
    assert "disk full" in summary["error"]
    assert not final.exists()
    assert Path(str(final) + ".partial").exists()              # kept for a resume once space is freed


@pytest.mark.parametrize("override,needle", [
    ({"layers.1.engram.embed.scale": {"dtype": "U8"}}, "layers.1.engram.embed.scale"),
    ({"layers.14.engram.embed.weight": {"dtype": "BF16"}}, "layers.14.engram.embed.weight"),
    ({"layers.1.engram.embed.weight": {"shape": [4839, 128]}}, "layers.1.engram.embed.weight"),
])
def test_wrong_dtype_or_shape_is_refused_naming_the_tensor(tools, tmp_path, override, needle):
    src = tmp_path / "bad"
    synth.make_source(str(src), vocab_size=200, overrides=override)
    out = tmp_path / "out"
    code, summary, log = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 0, expect=2)
    assert needle in summary["error"] and "refused" in summary["error"]
    assert not out.exists() or os.listdir(out) == []


def test_missing_tensor_and_config_mismatch_are_refused(tools, tmp_path):
    src = tmp_path / "only1"
    synth.make_source(str(src), vocab_size=200, write_layers=[1], index=False)   # scan path, no index
    out = tmp_path / "out"
    _, summary, _ = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 1, expect=2)
    assert "layers.14.engram.embed.weight" in summary["error"]
    _, summary, _ = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 1, "--layers", 1)
    assert summary["ok"]                                      # found by scanning shard headers
    cfg = config(src)
    cfg["text_config"]["engram_num_embeddings"][0] += 1
    (src / "config.json").write_text(json.dumps(cfg))
    _, summary, _ = run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 1,
                             "--layers", 1, expect=2)
    assert "engram_num_embeddings" in summary["error"]


def test_probe_reports_iops_and_latency(tools, src, tmp_path):
    out = tmp_path / "probe"
    run_tool(tools, "pack.py", "--src", src, "--out", out, "--tp", 2, "--rank", 0, "--layers", 1)
    _, res, _ = run_tool(tools, "probe.py", "--file", out / L.packed_name(1, 0, 2), "--qd", "1,8",
                         "--seconds", 0.3, subprocess_=True)
    assert res["ok"] and res["mode"] in ("direct", "buffered")
    assert [r["qd"] for r in res["results"]] == [1, 8]
    for r in res["results"]:
        assert r["ops"] > 0 and r["iops"] > 0 and r["seconds"] < 5
        assert 0 < r["lat_us"]["p50"] <= r["lat_us"]["p99"] <= r["lat_us"]["max"]


def test_pack_in_process_import_path(src, tmp_path):
    """The same module also works imported as runbook.engram_tools.pack (relative layout import)."""
    from runbook.engram_tools import pack
    out = tmp_path / "inproc"
    assert pack.main(["--src", str(src), "--out", str(out), "--tp", "2", "--rank", "0", "--layers", "1",
                      "--progress-every", "0"]) == 0
    assert (out / L.packed_name(1, 0, 2)).read_bytes() == expected_file(src, 1, 0, 2)


def test_synth_rows_are_distinct_and_deterministic(tmp_path):
    a = synth.tensor_block("layers.1.engram.embed.weight", 256, 4000, 200, synth.base_block(0))
    b = synth.tensor_block("layers.1.engram.embed.weight", 256, 4100, 50, synth.base_block(0))
    assert a[100 * 256:150 * 256] == b                       # any row range regenerates identically
    rows = {a[i * 256:(i + 1) * 256] for i in range(200)}
    assert len(rows) == 200
