import json
import os

import pytest

from runbook.evidence import RunDir, atomic_write, new_run_id, scrub_tree
from runbook.secrets import Redactor


def test_atomic_write_leaves_no_partial_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "a" / "file.json"
    atomic_write(target, "one")
    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        atomic_write(target, "two")
    assert target.read_text() == "one"
    assert [p.name for p in target.parent.iterdir()] == ["file.json"]


def test_run_dir_manifest_and_sidecar(tmp_path):
    run = RunDir.create("lab", root=tmp_path, redactor=Redactor(["s3cret-token-value"]))
    assert run.path.parent == tmp_path and run.run_id.endswith("-lab")
    run.record_step("00_preflight", status="running")
    run.record_step("00_preflight", status="passed", seconds=1.5)
    manifest = run.manifest()
    assert manifest["steps"]["00_preflight"] == {"status": "passed", "seconds": 1.5}
    run.write_sidecar("00_preflight", [{"name": "x", "observed": "token s3cret-token-value"}], {}, "passed")
    sidecar = run.read_sidecar("00_preflight")
    assert sidecar["checks"][0]["observed"] == "token ***"


def test_two_runs_in_the_same_second_get_distinct_dirs(tmp_path):
    a = RunDir.create("lab", root=tmp_path)
    b = RunDir.create("lab", root=tmp_path)
    assert a.path != b.path


def test_scrub_tree_masks_secret_values(tmp_path):
    (tmp_path / "nb.ipynb").write_text(json.dumps({"out": "Authorization: Bearer abcdef123456"}))
    (tmp_path / "clean.txt").write_text("nothing here")
    changed = scrub_tree(tmp_path, Redactor(["abcdef123456"]))
    assert changed == ["nb.ipynb"]
    assert "abcdef123456" not in (tmp_path / "nb.ipynb").read_text()


def test_run_id_is_filesystem_safe():
    assert "/" not in new_run_id("my profile/../x")
