"""What a notebook's markdown says matches what its step's code does today: the claims are derived from the
code (module attributes, the shipped tool's imports, the profile model, the CLI parser), not from strings
copied into this test."""
from __future__ import annotations

import ast
import json
import os
import re
import sys
import typing
from pathlib import Path

from runbook import secrets
from runbook.cli import build_parser
from runbook.preflight import node_needs
from runbook.profile.model import KEYS, Profile
from runbook.report.html_parts import PAGE_WIDTH
from runbook.report.html_page import NEXT_TITLE
from runbook.weights import sharing

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def narrative(path: Path) -> str:
    """Every markdown cell of the notebook, joined; lines rejoined so a phrase may wrap."""
    cells = json.loads(path.read_text())["cells"]
    return re.sub(r"\s*\n\s*", " ", "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown"))


def notebook(stem_prefix: str) -> str:
    found = [p for p in NOTEBOOKS if p.name.startswith(stem_prefix)]
    assert len(found) == 1, f"no single notebook {stem_prefix}_*.ipynb: {found}"
    return narrative(found[0])


def test_there_are_narratives():
    assert NOTEBOOKS and all(narrative(p) for p in NOTEBOOKS)


def test_the_weights_narrative_names_the_downloader_the_step_ships():
    tool = Path(sharing.node_download.__file__)            # what download_on_node copies to a node and runs
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(tool.read_text()))
                if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])}
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    text = notebook("02")
    said = re.findall(r"downloads? with `([^`]+)`", text)
    assert said, "02 does not say what the head downloads with"
    assert set(said) == {tool.name}, f"02 says the download runs with {said}; the step ships {tool.name}, which " \
                                     f"imports only the standard library"
    assert f"runs {tool.name}" in text or f"same `{tool.name}`" in text   # download-both: the worker runs it too


def _secrets_file_shown() -> str:
    """The default secrets file as a person writes it (``~`` for the home directory)."""
    path = str(secrets.default_secrets_file({}))
    home = os.path.expanduser("~")
    return "~" + path[len(home):] if path.startswith(home) else path


def test_a_narrative_naming_a_secret_says_it_may_come_from_the_secrets_file():
    naming = {p.name: [n for n in secrets.FILE_KEYS if f"`{n}`" in narrative(p)] for p in NOTEBOOKS}
    naming = {name: keys for name, keys in naming.items() if keys}
    assert naming, "no narrative names a secret"
    for name, keys in naming.items():
        text = notebook(name[:2])
        assert f"`{_secrets_file_shown()}`" in text and "0600" in text, \
            f"{name} names {keys} but not the secrets file {_secrets_file_shown()} (mode 0600) load_secrets reads"
        assert not re.search(r"only from the environment|`(?:%s)` only" % "|".join(keys), text), \
            f"{name} says {keys} come from the environment only"


def test_the_secrets_narratives_are_where_the_secrets_are_used():
    assert f"`{secrets.HF_ENV[0]}`" in notebook("02")        # the download's token
    assert f"`{secrets.API_ENV[0]}`" in notebook("04")       # the launch generates / requires the key
    assert f"`{secrets.API_ENV[0]}`" in notebook("05")       # the smoke requests send it


def test_the_weights_narrative_lists_every_sync_mode_of_the_profile():
    modes = typing.get_args(Profile.model_fields["weight_sync"].annotation)
    assert modes
    text = notebook("02")
    assert all(f"`{m}`" in text for m in modes), (modes, text)


def test_every_profile_key_a_narrative_names_exists():
    known = set(KEYS) | set(secrets.FILE_KEYS) | {"RUNBOOK_SECRETS_FILE"}
    named = {(p.name, key) for p in NOTEBOOKS for quoted in re.findall(r"`([^`]+)`", narrative(p))
             for key in re.findall(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b|\b[A-Z]{4,}\b(?==)", quoted)}
    assert named, "no profile key named in any narrative"
    assert not [x for x in named if x[1] not in known], sorted(x for x in named if x[1] not in known)


def test_every_command_a_narrative_names_exists():
    commands = set(next(a for a in build_parser()._actions if a.dest == "command").choices)
    named = {(p.name, c) for p in NOTEBOOKS for c in re.findall(r"python -m runbook (\w+)", narrative(p))}
    assert named
    assert not [x for x in named if x[1] not in commands], sorted(named)


def test_the_report_narrative_says_what_the_page_opens_with():
    text = notebook("08")
    assert f"{PAGE_WIDTH:,}-pixel screen" in text                  # the width the browser test holds the page to
    assert "headline" in text and f"**{NEXT_TITLE}**" in text


def test_the_preflight_narrative_gives_the_node_python_the_shipped_tools_need():
    need = ".".join(map(str, node_needs.MIN_PYTHON))
    assert f"`python3` ({need} or later" in notebook("00")
