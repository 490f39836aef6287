"""A node path reaches a shell expanded, or as ``"$HOME"/…`` the node's shell expands: never a quoted ``~``.

The render test reads every command the offline review prints for every shipped profile and scans it with the
shell's own quoting rules: a ``~`` that starts a path inside quotes (or mid-word, where bash does not expand it)
stays a literal ``~``, and a ``$HOME`` inside single quotes stays the five characters ``$HOME``. An inner script
(``sh -c '…'``, a container's command) is scanned as quoted text too: its paths are written absolute, since a
``~`` or ``$HOME`` there would be the container's or the inner user's home, not the SSH user's.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from runbook.errors import RunbookError
from runbook.facts import node_paths, system
from runbook.review import review

ROOT = Path(__file__).resolve().parents[2]
PROFILES = sorted((ROOT / "env").glob("*.env"))
_BLOCK_START = re.compile(r"^\[[\w-]+\] \[\w+\] ")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=$")


def unexpanded_home(command: str) -> list[str]:
    """Where ``command`` hands a home to its program unexpanded: a ``~`` starting a path inside quotes or
    mid-word outside an assignment, or ``$HOME`` inside single quotes. Returns a snippet per finding."""
    found, quote, word = [], "", ""
    i, n = 0, len(command)
    while i < n:
        c = command[i]
        if quote == "'":
            if c == "'":
                quote = ""
            elif command.startswith("$HOME", i):
                found.append(command[max(0, i - 30):i + 30])
            elif c == "~" and word_start(command, i, quoted=True):
                found.append(command[max(0, i - 30):i + 30])
            word += c
            i += 1
            continue
        if c == "\\":
            word += command[i:i + 2]
            i += 2
            continue
        if quote == '"':
            if c == '"':
                quote = ""
            elif c == "~" and word_start(command, i, quoted=True):
                found.append(command[max(0, i - 30):i + 30])
            word += c
            i += 1
            continue
        if c in "'\"":
            quote = c
        elif c.isspace() or c in ";|&()<>`":
            word = ""
            i += 1
            continue
        elif c == "~" and word and not _ASSIGNMENT.match(word) and path_follows(command, i):
            found.append(command[max(0, i - 30):i + 30])
        word += c
        i += 1
    return found


def path_follows(text: str, i: int) -> bool:
    return i + 1 >= len(text) or text[i + 1] in "/'\" \n;:"


def word_start(text: str, i: int, *, quoted: bool) -> bool:
    """A quoted ``~`` that a person meant as a home: first in its quotes (or after a space, ``:`` or ``=``
    there) and followed by ``/`` or the end of the word."""
    return text[i - 1] in "'\" :=" and path_follows(text, i)


def commands(text: str) -> list[str]:
    """The review's commands: a ``[node] [kind]`` line and its continuation lines, and the launch plan's
    rendered commands (``docker run \\`` blocks); ``#`` lines are the review's own notes."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("#"):
            blocks.append([])
            continue
        m = _BLOCK_START.match(line)
        if m:
            blocks.append([line[m.end():]])
        elif blocks:
            blocks[-1].append(line)
        else:
            blocks.append([line])
    return ["\n".join(b) for b in blocks if any(x.strip() for x in b)]


@pytest.mark.parametrize("bad", ["p='~/.cache/x'; df \"$p\"", 'ls "~/x"', "ls '$HOME/x'", "cp a --to=~/x",
                                 "docker run -v /a:~/b img"])
def test_scanner_finds_an_unexpanded_home(bad):
    assert unexpanded_home(bad), bad


@pytest.mark.parametrize("good", ['p="$HOME"/\'.cache/x\'; df "$p"', "ls ~/x", "X=~/x cmd", 'printf %s "$HOME"',
                                  "ls /a/~b", "re.split(r\"[ ;<>=!~\\[]\", r)", "echo \"$HOME/.nccl.conf\""])
def test_scanner_passes_what_the_shell_expands(good):
    assert unexpanded_home(good) == [], good


def test_every_rendered_command_of_every_profile_expands_its_home():
    assert PROFILES, "no shipped profile under env/"
    bad: dict[str, list[str]] = {}
    total = 0
    for profile in PROFILES:
        cmds = commands(review(profile, home="/home/spark"))
        assert cmds, f"{profile.name}: the review rendered no command"
        total += len(cmds)
        for cmd in cmds:
            bad.setdefault(profile.name, []).extend(unexpanded_home(cmd))
    assert total > 100
    assert not {k: v for k, v in bad.items() if v}, bad


def test_shell_path_is_expanded_by_the_nodes_shell(tmp_path):
    home = tmp_path / "home"
    (home / ".cache" / "my dir").mkdir(parents=True)
    word = node_paths.shell_path("~/.cache/my dir")
    out = subprocess.run(["bash", "-c", f"printf %s {word}"], env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout
    assert out == f"{home}/.cache/my dir"
    assert node_paths.shell_path("~") == '"$HOME"'
    assert node_paths.shell_path("/mnt/a b") == "'/mnt/a b'"
    with pytest.raises(RunbookError, match="another user's home"):
        node_paths.shell_path("~spark/x")


def test_disk_free_measures_the_filesystem_under_the_nodes_home(tmp_path):
    """Preflight's disk row for ``~/.cache/…/model``: the walk up must stop in $HOME's tree, not at ``.``."""
    home = tmp_path / "home"
    (home / ".cache").mkdir(parents=True)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    out = subprocess.run(["bash", "-c", system.disk_free_cmd("~/.cache/dsv41/model")], cwd=elsewhere,
                         env={"HOME": str(home), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         check=True).stdout
    free = system.parse_disk_free(out)
    assert free.existing_path == f"{home}/.cache"
    assert free.avail_bytes > 0


def test_preflight_disk_rows_measure_each_nodes_own_weights_dir():
    text = review(ROOT / "env" / "exl3-v41.env", home="/home/spark",
                  overrides={"WORKER_WEIGHTS_DIR": "/mnt/nvme/model"})
    preflight = text.split("\n## 00_preflight", 1)[1].split("\n## ", 1)[0]
    df = [line for line in preflight.splitlines() if "df -B1" in line]
    assert df
    assert any(line.startswith("[worker] [read] p=/mnt/nvme/model;") for line in df)
    assert any(line.startswith("[head] [read] p=\"$HOME\"/.cache/dsv41-flash-exl3/model;") for line in df)
    assert not any(line.startswith("[worker]") and "dsv41-flash-exl3/model" in line for line in df)
