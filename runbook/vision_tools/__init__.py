"""Step 06 — vision and tool calls: the vision cases, then the tool-call battery, against the launched server; then the
garble detector over every answer the step received (docs/quality.md)."""
from __future__ import annotations

import contextlib

from ..answers.garble import garble_check
from ..answers.quality import judged
from .battery import run_battery
from ..api.server_info import ApiClient, Archive, connect
from ..api.watchdog import watching
from .vision import run_vision


def run(step, *, base_url: str = "", model: str = "", image_path_on_server: str = "") -> ApiClient | None:
    """Step 06's entry: the vision cases, the tool-call battery, then the garble row over every answer; rows,
    raw exchanges (``raw/06_vision_tools/``) and data recorded through the step."""
    profile, dry_run = step.profile, step.dry_run
    client = connect(profile, step.run.path, dry_run=dry_run, base_url=base_url, model=model)
    if client is not None:
        step.data["server"] = client.server.describe()
    rec = Archive(f"raw/{step.name}")
    try:
        # the watchdog needs the profile's server: not for a server passed in by base_url
        with watching(profile, step.add, dry_run=dry_run) if not base_url else contextlib.nullcontext():
            step.add(run_vision(client, profile, rec, dry_run=dry_run, image_path_on_server=image_path_on_server))
            step.add(run_battery(client, profile, rec, dry_run=dry_run))
        if client is not None:               # a dry run sent nothing: no answers to judge
            step.add(garble_check(rec, judged=judged(profile)))
    finally:                                 # what was asked before a crash is evidence too
        step.archive(rec.files)
        step.data.update(rec.data)
    return client
