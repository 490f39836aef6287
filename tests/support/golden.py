"""Golden files: a missing or different file fails; ``UPDATE_GOLDEN=1`` (re)writes them, on request only.

    check_golden(GOLDEN / "exl3-v41.txt", text)       # fails naming the file and how to accept the change
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest


def check_golden(path: Path, text: str, *, environ=os.environ) -> None:
    if environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"golden file {path} is missing: review the output, then write it with UPDATE_GOLDEN=1")
    want = path.read_text()
    if text != want:
        diff = "".join(list(difflib.unified_diff(want.splitlines(keepends=True), text.splitlines(keepends=True),
                                                 fromfile=str(path), tofile="now"))[:60])
        pytest.fail(f"output changed against {path}; review the diff and accept it with UPDATE_GOLDEN=1:\n{diff}")
