"""The HTML pieces the run page and the results index share: style, cells, tables, number format."""
from __future__ import annotations

import html
import math
import re
from typing import Any, Callable, Iterable

from ..secrets import Redactor

__all__ = ["CSS", "COLOURS", "PAGE_WIDTH", "escaper", "fmt", "clip", "cell", "status_cell", "table", "img",
           "external_refs"]

COLOURS = {"PASS": "#d4edda", "FAIL": "#f8d7da", "WARN": "#fff3cd", "N/A": "#e2e3e5", "NO-OP": "#d1ecf1",
           "SIMULATED": "#e8dff5", "passed": "#d4edda", "failed": "#f8d7da", "running": "#fff3cd",
           "not run": "#eeeeee", "validated": "#d4edda", "candidate": "#fff3cd"}

#: the narrowest screen the page is laid out for (tests/unit/test_report_page_browser.py checks it in Chromium)
PAGE_WIDTH = 1280

# A cell breaks between words; a long text (cell(), td.wrap, td.small) also anywhere: overflow-wrap:anywhere
# lowers the cell's minimum width, which break-word does not, so no hash, path or URL pushes a table past
# the page's 1,200 pixels, while short columns (node, status) keep their words whole.
CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1200px;padding:0 12px;color:#222;font-size:14px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:18px;border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:32px}
h3{font-size:15px;margin-bottom:6px} table{border-collapse:collapse;margin:6px 0 12px;width:100%}
th,td{border:1px solid #d0d0d0;padding:3px 6px;text-align:left;vertical-align:top;overflow-wrap:break-word}
td.long,td.wrap,td.small{overflow-wrap:anywhere}
th{background:#f3f3f3} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.st{font-weight:600;text-align:center;white-space:nowrap} .muted{color:#777} .small{font-size:12px}
pre{background:#f7f7f7;border:1px solid #ddd;padding:8px;overflow-x:auto;font-size:12px;white-space:pre-wrap;word-break:break-all}
.badge{display:inline-block;padding:2px 8px;border-radius:10px;margin-right:6px;font-weight:600}
.note{background:#fff8e1;border-left:4px solid #f0ad4e;padding:6px 10px;margin:6px 0}
.notrun{background:#f4f4f4;border-left:4px solid #aaa;padding:6px 10px;margin:6px 0;color:#555}
details>summary{cursor:pointer;font-weight:600;margin:4px 0} img{max-width:100%}
nav a{margin-right:10px} td.wrap{overflow-wrap:anywhere;min-width:8em}
.verdict{padding:8px 12px;margin:0 0 8px;border-radius:4px} .verdict h1{margin:2px 0 6px}
.verdict ul{margin:4px 0 2px;padding-left:22px} .next{border:2px solid #9ec5fe;border-radius:4px;padding:6px 12px;margin:8px 0}
.next pre{margin:4px 0} code{overflow-wrap:anywhere}
"""

_EXT_RX = re.compile(r"""(?:src|href|url)\s*[=(]\s*["']?\s*(?:https?:)?//""", re.I)


def escaper(red: Redactor) -> Callable[[Any], str]:
    """``e(x)``: text of ``x`` with secrets masked, HTML-escaped ("" for None)."""
    return lambda x: html.escape(red.redact(str(x)) if x is not None else "")


def fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and math.isfinite(v):
        s = f"{v:,.0f}" if abs(v) >= 10000 else f"{v:.4g}"
    else:
        s = str(v)
    return f"{s} {unit}".strip() if unit else s


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis ends a cut text)."""
    return text if len(text) <= limit else text[: max(limit - 1, 1)].rstrip() + "…"


def cell(value: Any, e: Callable[[Any], str], limit: int = 60, cls: str = "") -> str:
    """A ``<td>`` of ``value`` shortened to ``limit`` characters; the full text (masked) on hover. A cut
    text or one with a long unbroken run (a path, a hash) may break anywhere (class ``long``)."""
    text = "" if value is None else str(value)
    long = len(text) > limit or any(len(w) > 30 for w in text.split())
    classes = " ".join(c for c in (cls, "long" if long else "") if c)
    attr = f' class="{classes}"' if classes else ""
    if len(text) <= limit:
        return f"<td{attr}>{e(text)}</td>"
    return f'<td{attr} title="{e(text)}">{e(clip(text, limit))}</td>'


def status_cell(s: str) -> str:
    return f'<td class="st" style="background:{COLOURS.get(s, "#fff")}">{html.escape(s)}</td>'


def table(headers: list[str], rows: Iterable[list[str]]) -> str:
    """A table of header texts (escaped here) and rows of ready-made ``<td>`` cells."""
    # a column name breaks after its underscores before it breaks anywhere else
    head = "".join(f"<th>{html.escape(h).replace('_', '_<wbr>')}</th>" for h in headers)
    body = "".join("<tr>" + "".join(r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def img(uri: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="{uri}">' if uri else ""


def external_refs(text: str) -> list[str]:
    """Attributes that would load something from the network (src=/href=/url() to http(s) or //)."""
    return [text[max(0, m.start() - 20): m.end() + 40] for m in _EXT_RX.finditer(text or "")]
