"""``results/index.json`` and ``results/index.html``: every run under a results folder, newest first,
with its profile, status, verdict (and what is missing), steps, check counts and headline figures
(recomputed from each run's files)."""
from __future__ import annotations

import datetime as _dt
import html
import json
from pathlib import Path
from typing import Any

from ..evidence import atomic_write
from ..secrets import Redactor, default_redactor
from .collector import collect
from .html_parts import COLOURS, CSS, escaper, fmt, status_cell, table
from .model import headline, headline_keys
from .runfiles import load_json

__all__ = ["REPORT_NAME", "index_entries", "write_index"]

REPORT_NAME = "report.html"


def index_entries(results_root: str | Path, redactor: Redactor | None = None) -> list[dict[str, Any]]:
    root = Path(results_root)
    out = []
    for m in sorted(root.glob("*/manifest.json")):
        run = m.parent
        man = load_json(m) or {}
        entry = {"run_id": man.get("run_id") or run.name, "profile": man.get("profile"), "status": man.get("status"),
                 "created": man.get("created"), "mode": man.get("mode"), "dry_run": man.get("dry_run"),
                 "steps": {k: v.get("status") for k, v in (man.get("steps") or {}).items()},
                 "report": f"{run.name}/{REPORT_NAME}" if (run / REPORT_NAME).exists() else None}
        try:
            model = collect(run, drift=False, redactor=redactor)
            entry["headline"] = headline(model)
            entry["checks"] = model.counts()
            entry["verdict"] = model.verdict.verdict if model.verdict is not None else None
            entry["verdict_missing"] = model.verdict.missing if model.verdict is not None else []
        except Exception as exc:  # noqa: BLE001 - one unreadable run never hides the others
            entry["headline"], entry["error"] = {}, f"{type(exc).__name__}: {exc}"
        out.append(entry)
    out.sort(key=lambda x: (str(x.get("created") or ""), x["run_id"]), reverse=True)
    return out


def write_index(results_root: str | Path, redactor: Redactor | None = None) -> tuple[Path, Path]:
    """``results/index.json`` and ``results/index.html``: every run, newest first, with headline figures."""
    root = Path(results_root)
    red = redactor or default_redactor()
    entries = index_entries(root, red)
    gen = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    jpath = atomic_write(root / "index.json", red.redact(json.dumps({"generated": gen, "runs": entries}, indent=1,
                                                                       default=str)) + "\n")
    keys = list(headline_keys())
    e = escaper(red)
    rows = []
    for en in entries:
        link = f'<a href="{html.escape(en["report"])}">{e(en["run_id"])}</a>' if en.get("report") else e(en["run_id"])
        hl = en.get("headline") or {}
        missing = en.get("verdict_missing") or []
        # the requirements missing, by name; what each lacks is on hover and in the run's report
        labels = ", ".join(m.split(": ", 1)[0] for m in missing)
        rows.append([f"<td>{link}</td>", f"<td>{e(en.get('profile'))}</td>", status_cell(str(en.get("status"))),
                     f'<td class="st" style="background:{COLOURS.get(str(en.get("verdict")), "#fff")};white-space:normal"'
                     + (f' title="{e("; ".join(missing))}"' if missing else "") + f'>{e(en.get("verdict") or "?")}'
                     + (f'<br><span class="small" style="font-weight:normal">missing: {e(labels)}</span>'
                        if missing else "") + "</td>",
                     f"<td class='small'>{e(en.get('created'))}</td>",
                     f"<td class='small'>{e(', '.join(en.get('steps') or {}))}</td>"]
                    + [f'<td class="num">{fmt(hl.get(k))}</td>' for k in keys])
    page = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Runs</title><style>{CSS}</style>"
            f"</head><body><h1>Runs under {e(root)}</h1><p class='small muted'>generated {e(gen)} · "
            f"headline figures recomputed from each run's files</p>"
            + table(["run", "profile", "status", "verdict", "created", "steps"] + keys, rows) + "</body></html>\n")
    hpath = atomic_write(root / "index.html", red.redact(page))
    return hpath, jpath
