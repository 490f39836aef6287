"""The Engram tools (runbook/engram/{pack,check,probe}.py and the modules shipped with them) as the
tests run them, an independent computation of the bytes a packed file must hold, and a node whose
``python3 <dir>/<tool>.py`` runs that tool in-process (shared by the pack, resume and step tests)."""
from __future__ import annotations

import contextlib
import functools
import importlib
import io
import json
import shlex
import shutil
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from runbook.engram_tools import layout as L
from runbook.engram_tools.ship import TOOL_FILES
from runbook.remote import CommandResult
from support.doubles import LocalNode

__all__ = ["ENGRAM_DIR", "PY", "run_tool", "source_table", "config", "expected_file", "tool_node"]

ENGRAM_DIR = Path(L.__file__).resolve().parent
PY = shutil.which("python3") or sys.executable        # the system python, no venv packages
_STDIO = threading.Lock()      # redirect_stdout is process-wide: one in-process tool at a time


def run_tool(tools: Path, script: str, *args, expect: int | None = 0,
             subprocess_: bool = False) -> tuple[int, dict, str]:
    """Run a tool's main(). In-process by default (the box is slow to start interpreters);
    ``subprocess_=True`` runs the copied standalone script with ``python3 -I`` like a node does."""
    argv = [str(a) for a in args]
    if subprocess_:
        proc = subprocess.run([PY, "-I", str(tools / script), *argv], capture_output=True,
                              text=True, timeout=120, cwd=tools)
        code, text = proc.returncode, proc.stdout + proc.stderr
        stdout = proc.stdout
    else:
        module = importlib.import_module(f"runbook.engram_tools.{script[:-3]}")
        out, err = io.StringIO(), io.StringIO()
        with _STDIO, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = module.main(argv)
        stdout, text = out.getvalue(), out.getvalue() + err.getvalue()
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    summary = json.loads(lines[-1]) if lines else {}
    if expect is not None:
        assert code == expect, text
    return code, summary, text


@functools.lru_cache(maxsize=8)
def source_table(src: Path, layer: int) -> bytes:
    """The layer's full interleaved table computed independently of the packer."""
    index = json.loads((src / L.INDEX_NAME).read_text())["weight_map"]
    shard = src / index[L.weight_name(layer)]
    data = shard.read_bytes()
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + n])
    w0, w1 = header[L.weight_name(layer)]["data_offsets"]
    s0, s1 = header[L.scale_name(layer)]["data_offsets"]
    w = data[8 + n + w0:8 + n + w1]
    s = data[8 + n + s0:8 + n + s1]
    rows = len(s) // 8
    assert len(w) == rows * 256
    return b"".join(w[i * 256:(i + 1) * 256] + s[i * 8:(i + 1) * 8] for i in range(rows))


def config(src: Path) -> dict:
    return json.loads((src / "config.json").read_text())


def expected_file(src: Path, layer: int, rank: int, tp: int) -> bytes:
    lay = L.EngramLayout.from_config(config(src), tp)
    rr = lay.rank_range(layer, rank)
    return rr.header() + source_table(src, layer)[rr.lo * 264:rr.hi * 264]


def tool_node(name: str, rank: int, **kw) -> LocalNode:
    """A LocalNode whose ``python3 <dir>/<tool>.py ...`` runs that tool's main() in-process (after shlex-parsing
    the exact command string; starting interpreters is slow on the shared test box); anything else runs under
    bash. The standalone scripts themselves run as subprocesses in test_engram_pack.py."""
    def in_process(command: str) -> CommandResult:
        argv = shlex.split(command)
        missing = [f for f in TOOL_FILES if not (Path(argv[1]).parent / f).exists()]
        assert not missing, f"{argv[1]} is shipped without {missing} beside it"
        module = importlib.import_module(f"runbook.engram_tools.{Path(argv[1]).stem}")
        out, err = io.StringIO(), io.StringIO()
        started = time.monotonic()
        with _STDIO, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = module.main(argv[2:])
        return CommandResult(name, command, code, out.getvalue(), err.getvalue(), time.monotonic() - started)

    return LocalNode(name, rank, rules=[(r"^python3 \S+/(layout|pack|check|probe)\.py( |$)", in_process)], **kw)
