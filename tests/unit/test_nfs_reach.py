"""Issue 34 item 3: the kernel NFS export is root_squash, so the worker's container (root) reads the share as
nobody -- an "other" to every file. Preflight reads, before any download, whether others can enter every directory
down to the export and read what is in it, and names the exact chmod when not (a 0750 home: DGX OS / Ubuntu's
default). These tests build real directory trees with real modes and read them with the real command."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from runbook.facts import node_paths as NP


@pytest.fixture
def tree():
    """A directory the test owns under /tmp (1777), opened to others (0755) so its own ancestors do not block;
    pytest's tmp_path sits under a 0700 directory."""
    root = Path(tempfile.mkdtemp(prefix="reach-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def reach(path: Path, umask: int = 0o022) -> NP.Reach:
    out = subprocess.run(["bash", "-c", f"umask {umask:03o}; {NP.reach_cmd(str(path))}"], capture_output=True,
                         text=True, check=True).stdout
    parsed = NP.parse_reach(str(path), out)
    assert parsed is not None, out
    return parsed


def test_a_0750_home_blocks_the_squashed_reader_before_anything_is_downloaded(tree):
    home = tree / "home" / "spark"
    (home / ".cache").mkdir(parents=True)
    (tree / "home").chmod(0o755)
    home.chmod(0o750)
    export = home / ".cache" / "dsv41-flash-exl3" / "model"
    r = reach(export)
    assert r.missing == (str(export), str(export.parent))
    assert [p for p, _, _ in r.have][:3] == [str(home / ".cache"), str(home), str(tree / "home")]
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    assert r.blocking(user) == [(f"{home} is 750 ({user}): others cannot enter it", f"chmod o+x {home}")]


def test_an_open_tree_with_readable_content_passes(tree):
    export = tree / "srv" / "models" / "m"
    export.mkdir(parents=True)
    for d in (tree / "srv", tree / "srv" / "models", export):
        d.chmod(0o755)
    (export / "config.json").write_text("{}")
    (export / "config.json").chmod(0o644)
    assert reach(export).blocking() == []


def test_content_others_cannot_read_and_a_closing_umask_are_named(tree):
    export = tree / "m"
    (export / "sub").mkdir(parents=True)
    export.chmod(0o755)
    (export / "sub").chmod(0o755)
    secret = export / "sub" / "model-00001.safetensors"
    secret.write_text("x")
    secret.chmod(0o600)
    r = reach(export, umask=0o027)
    why = [w for w, _ in r.blocking("nobody-owns-this")]
    assert why == [f"{secret} cannot be read by others", "umask 0027 makes new files under it unreadable to others"]
    fixes = [f for _, f in r.blocking()]
    assert fixes[0] == f"chmod -R o+rX {export}" and fixes[1].startswith("umask 022 for the SSH user")


def test_the_export_itself_needs_list_and_enter_and_a_root_owned_parent_needs_sudo():
    r = NP.parse_reach("/srv/m", "0022\nhave 711 spark /srv/m\nhave 750 root /srv\nhave 755 root /\n")
    assert r.blocking("spark") == [("/srv/m is 711 (spark): others cannot list and enter it", "chmod o+rx /srv/m"),
                                   ("/srv is 750 (root): others cannot enter it", "sudo chmod o+x /srv")]


def test_text_that_is_not_the_commands_output_is_none():
    assert NP.parse_reach("/x", "unknown") is None
    assert NP.parse_reach("/x", "") is None
    assert NP.parse_reach("/x", "0022\n") is None


def test_the_command_changes_nothing(tree):
    """Only stat and find: nothing is written in the tree (its mtime stays)."""
    before = os.stat(tree).st_mtime_ns
    reach(tree)
    assert os.stat(tree).st_mtime_ns == before
