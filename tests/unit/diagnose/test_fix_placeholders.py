"""A fix printed by the offline diagnose never shows a template's ``{placeholder}``: the value the text gave is filled
in (the signature's extraction reaches the ranked entry), and one it did not give reads ``<name>``. Measured on the
frozen held-out corpus: 4 of 52 cases printed ``{port}``, ``{path}`` or ``{address}`` before."""
from __future__ import annotations

import json
import re
from pathlib import Path

from runbook.diagnose.offline import diagnose_text, render

DATA = Path(__file__).resolve().parents[1] / "data" / "diagnose_frozen"
BRACES = re.compile(r"\{(?:port|path|address|disk|package|version|component|master_port|model)\}")


def _cases() -> list[dict]:
    out = []
    for f in sorted(DATA.glob("*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def test_no_printed_fix_carries_a_template_placeholder():
    cases = [c for c in _cases() if c.get("text")]
    assert len(cases) > 20
    leaks = []
    for case in cases:
        ranked = diagnose_text(case["text"])
        out = render(ranked) if ranked else ""
        if BRACES.search(out) or any(BRACES.search(r.to_dict()["fix"]) for r in ranked):
            leaks.append(case.get("id"))
    assert not leaks, leaks


def test_an_extracted_port_reaches_the_fix():
    text = ("RuntimeError: The server socket has failed to listen on any local network address. "
            "port: 29511, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use\n")
    ranked = diagnose_text(text)
    assert ranked
    fixes = " ".join(r.to_dict()["fix"] for r in ranked)
    assert "{port}" not in fixes
