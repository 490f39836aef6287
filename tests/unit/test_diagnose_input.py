"""Every file input of ``diagnose --log`` is bounded (issue 37 item 5), through the real CLI in a subprocess: a device,
a FIFO, a binary file, 200 MB of random bytes, a file over the cap, an archive whose member declares more than the
cap, a missing or unreadable file: each refused with exit 2 and a message that names it. The subprocess runs under
an address-space limit (the old code grew until it was killed) and a wall-clock timeout (the old code blocked on a
FIFO forever); neither is a timing assertion."""
from __future__ import annotations

import io
import os
import resource
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from runbook.diagnose.inputs import MAX_INPUT_BYTES

REPO = Path(__file__).resolve().parents[2]
AS_LIMIT = 2 << 30          # far above what a bounded read needs; far below what reading /dev/zero whole takes


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def diagnose(*paths, timeout: int = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "runbook", "diagnose", "--log", *map(str, paths)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=_limit)


def refused(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and r.stdout == ""
    for w in words:
        assert w in r.stderr, r.stderr


def test_a_plain_log_still_matches(tmp_path):
    log = tmp_path / "rank.log"
    log.write_text("INFO starting\nsh: 1: ray: not found\n")
    r = diagnose(log)
    assert r.returncode == 0 and "ray-missing" in r.stdout, r.stderr


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_an_endless_device_is_refused_before_it_is_read(device):
    refused(diagnose(device, timeout=30), device, "character device", "not a log file")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "rank.log"
    os.mkfifo(fifo)
    refused(diagnose(fifo, timeout=30), str(fifo), "a FIFO")


def test_a_binary_file_is_not_a_text_log(tmp_path):
    exe = tmp_path / "vllm.bin"
    exe.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 4)
    refused(diagnose(exe), str(exe), "this is not a text log", "NUL byte")
    no_nul = tmp_path / "noise.log"              # binary with no NUL byte at all
    no_nul.write_bytes(bytes(range(1, 256)) * 400)
    refused(diagnose(no_nul), str(no_nul), "this is not a text log", "are not text")


def test_200_mb_of_random_bytes_are_refused(tmp_path):
    blob = tmp_path / "random.log"
    with open(blob, "wb") as fh:
        for _ in range(200):
            fh.write(os.urandom(1_000_000))
    refused(diagnose(blob), str(blob), "this is not a text log")


def test_a_text_file_over_the_cap_is_refused_from_its_size(tmp_path):
    big = tmp_path / "huge.log"
    with open(big, "wb") as fh:                  # text first (it passes the binary check), then a hole to 65 MiB
        fh.write(b"INFO a line of a log\n" * 5000)
        fh.truncate(MAX_INPUT_BYTES + (1 << 20))
    refused(diagnose(big), str(big), f"at most {MAX_INPUT_BYTES >> 20} MiB", "tail -c")


def test_inputs_together_are_capped(tmp_path):
    parts = []
    for i in range(3):                           # each under the cap, together over it
        p = tmp_path / f"part{i}.log"
        p.write_bytes(b"INFO line\n" * (MAX_INPUT_BYTES // 10 // 2))
        parts.append(p)
    refused(diagnose(*parts), f"at most {MAX_INPUT_BYTES >> 20} MiB (all inputs together)")


def test_an_archive_member_is_judged_by_its_declared_size_before_unpacking(tmp_path):
    bomb = tmp_path / "diagnose-20261205-000000.tar.gz"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("diagnose-x/head/rank.log")
        info.size = 2 * MAX_INPUT_BYTES
        tar.addfile(info, io.BytesIO(b"A" * info.size))
    bomb.write_bytes(buf.getvalue())
    assert bomb.stat().st_size < MAX_INPUT_BYTES // 100      # small on disk, large unpacked
    refused(diagnose(bomb), "head/rank.log", f"at most {MAX_INPUT_BYTES >> 20} MiB")


def test_a_fifo_inside_a_folder_of_logs_is_refused(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "head.log").write_text("INFO fine\n")
    os.mkfifo(logs / "worker.log")
    refused(diagnose(logs, timeout=30), "worker.log", "a FIFO")


def test_missing_input_exits_2(tmp_path):
    refused(diagnose(tmp_path / "nope.log"), "no such log or bundle", "nope.log")


def _unreadable(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        p = tmp_path / "locked.log"
        p.write_text("INFO x\n")
        p.chmod(0)
        return p
    return Path("/proc/sys/vm/compact_memory")   # mode 0200: not readable even by root


def test_an_unreadable_input_exits_2(tmp_path):
    p = _unreadable(tmp_path)
    with pytest.raises(PermissionError):          # the premise: this user cannot read it
        open(p, "rb").close()
    refused(diagnose(p), f"cannot read {p}", "Permission denied")


def _accuracy(corpus: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "runbook", "diagnose", "--accuracy", "--corpus", str(corpus)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=30, preexec_fn=_limit)


def test_the_accuracy_corpus_is_an_input_too(tmp_path):
    """--corpus names a user's folder: a FIFO among its *.jsonl, or a missing folder, is a bad argument (2)."""
    os.mkfifo(tmp_path / "cases.jsonl")
    refused(_accuracy(tmp_path), "cases.jsonl", "a FIFO")
    refused(_accuracy(tmp_path / "missing"), "no *.jsonl corpus files")
