"""Run the catalogue over a bundle: :func:`match` -> findings, and the pages that list them."""
from __future__ import annotations

import html
import string
from dataclasses import asdict, dataclass
from typing import Any

from . import bundle as B
from .catalogue import ENTRIES
from .catalogue.entry import SEVERITY_ORDER, Entry, line_signature


@dataclass
class Finding:
    id: str
    title: str
    severity: str
    node: str
    evidence: list[str]
    cause: str
    fix: str
    proof: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_text(self) -> str:
        ev = "\n".join(f"    {e}" for e in self.evidence)
        return (f"[{self.severity}] {self.title} ({self.id}, {self.node})\n{ev}\n"
                f"  cause: {self.cause}\n  fix:   {self.fix}\n  proof: {self.proof}")


class _Defaults(dict):
    def __missing__(self, key: str) -> str:
        return "<" + key + ">"          # not in the text: the reader fills it (never Python's braces)


def render_fix(template: str, values: dict[str, str]) -> str:
    """Fill ``{name}`` placeholders that are known; the others read ``<name>`` (a value the text did not give)."""
    return string.Formatter().vformat(template, (), _Defaults(values))


_render = render_fix


def _values(bundle: B.Bundle, node: str) -> dict[str, str]:
    ctx = bundle.context
    info = ctx.node(node) or ctx.head
    peer = next((n for n in ctx.nodes if info and n.name != info.name), None)
    vals = {"master_addr": ctx.master_addr, "master_port": str(ctx.master_port or ""), "port": str(ctx.port or ""),
            "model": ctx.served_model_name, "fabric_mtu": str(ctx.fabric_mtu or ""), "api_url": ctx.api_url}
    if info:
        vals["fabric_if"] = info.fabric_if
    if peer:
        vals["peer_ip"] = peer.fabric_ip
    return {k: v for k, v in vals.items() if v}


def match(bundle: B.Bundle, entries: tuple[Entry, ...] = ENTRIES) -> list[Finding]:
    """Every entry whose signature holds, most severe first (catalogue order within a severity).

    A signature that raises is reported as a finding of its own (``<id>:error``) rather than hiding
    the others: a diagnose run must never die on the text it is diagnosing."""
    found: list[tuple[int, int, Finding]] = []
    for order, entry in enumerate(entries):
        try:
            hits = entry.signature(bundle) if entry.signature else line_signature(entry, bundle)
        except Exception as exc:  # noqa: BLE001 - one bad signature must not hide the rest
            found.append((0, order, Finding(f"{entry.id}:error", f"signature error in {entry.id}", "warning",
                                            "local", [f"{type(exc).__name__}: {exc}"], "a bug in the catalogue",
                                            "report it with this bundle", "")))
            continue
        for hit in hits:
            vals = {**_values(bundle, hit.node), **hit.vars}
            found.append((SEVERITY_ORDER.get(entry.severity, 9), order,
                          Finding(entry.id, entry.title, entry.severity, hit.node, list(hit.evidence),
                                  entry.cause, _render(entry.fix, vals), _render(entry.proof, vals))))
    return [f for _, _, f in sorted(found, key=lambda t: (t[0], t[1]))]


# --------------------------------------------------------------------------- pages


def render_markdown(findings: list[Finding], bundle: B.Bundle, *, title: str = "diagnose") -> str:
    out = [f"# {title}", ""]
    nodes = ", ".join(f"{n} ({len(bundle.texts.get(n, {}))} texts)" for n in [*bundle.nodes, B.LOCAL]
                      if n in bundle.texts)
    out += [f"Collected: {nodes or 'nothing'}.", ""]
    if not findings:
        out += ["No catalogue entry matched. The archive holds every collected text for a maintainer.", ""]
    else:
        out += [f"{len(findings)} finding(s), most severe first.", ""]
    for f in findings:
        out += [f"## [{f.severity}] {f.title}", "", f"`{f.id}` on **{f.node}**", "", "Evidence:", ""]
        out += [f"    {e}" for e in f.evidence] + [""]
        out += [f"- Cause: {f.cause}", f"- Fix: {f.fix}", f"- Proof: `{f.proof}`", ""]
    out += ["## Files", ""]
    for node in [*bundle.nodes, B.LOCAL]:
        for name, text in sorted(bundle.texts.get(node, {}).items()):
            out.append(f"- `{node}/{name}` ({len(text.splitlines())} lines)")
    return "\n".join(out) + "\n"


def render_html(findings: list[Finding], bundle: B.Bundle, *, title: str = "diagnose") -> str:
    e = html.escape
    rows = "".join(
        f"<tr class='{e(f.severity)}'><td>{e(f.severity)}</td><td><b>{e(f.title)}</b><br><code>{e(f.id)}</code></td>"
        f"<td>{e(f.node)}</td><td><pre>{e(chr(10).join(f.evidence))}</pre></td><td>{e(f.cause)}</td>"
        f"<td>{e(f.fix)}</td><td><code>{e(f.proof)}</code></td></tr>" for f in findings)
    body = (f"<table><tr><th>severity</th><th>finding</th><th>node</th><th>evidence</th><th>cause</th>"
            f"<th>fix</th><th>proof</th></tr>{rows}</table>" if findings
            else "<p>No catalogue entry matched. The archive holds every collected text.</p>")
    files = "".join(f"<li><code>{e(n)}/{e(name)}</code></li>" for n in [*bundle.nodes, B.LOCAL]
                    for name in sorted(bundle.texts.get(n, {})))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>"
            "body{font-family:sans-serif;margin:1em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:4px;vertical-align:top}pre{white-space:pre-wrap;margin:0;font-size:85%}"
            "tr.fatal td:first-child{background:#f8d7da}tr.degraded td:first-child{background:#fff3cd}"
            "tr.warning td:first-child{background:#e2e3e5}</style></head><body>"
            f"<h1>{e(title)}</h1>{body}<h2>Files</h2><ul>{files}</ul></body></html>\n")


def catalogue_markdown(entries: tuple[Entry, ...] = ENTRIES, tests: dict[str, list[str]] | None = None,
                       corpus: dict[str, int] | None = None) -> str:
    """The catalogue as a markdown table: symptom -> cause -> fix -> how detected -> source -> lab -> tests
    (the fixture scenarios that must produce it, and its number of cases in the accuracy corpus)."""
    def cell(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")
    out = ["| id | severity | symptom | cause | fix | how detected | source | lab injection | tests |",
           "|---|---|---|---|---|---|---|---|---|"]
    for en in entries:
        t = ", ".join(f"`{x}`" for x in (tests or {}).get(en.id, []))
        n = (corpus or {}).get(en.id, 0)
        t = "; ".join(x for x in (t, f"{n} corpus case{'s' if n != 1 else ''}" if n else "") if x) or "-"
        out.append(f"| `{en.id}` | {en.severity} | {cell(en.symptom)} | {cell(en.cause)} | {cell(en.fix)} | "
                   f"{cell(en.detect)} | {cell(en.source)} | {cell(en.lab)} | {t} |")
    return "\n".join(out) + "\n"
