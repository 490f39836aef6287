"""Step 06 — vision and tool calls: the vision cases, then the tool-call battery, against the launched server; then the
garble detector over every answer the step received (docs/quality.md)."""
from __future__ import annotations

import contextlib

from ..answers.garble import garble_check
from ..answers.quality import judged
from .battery import run_battery
from ..api.server_info import ApiClient, connect
from ..api.watchdog import watching
from .vision import run_vision


def run(step, *, base_url: str = "", model: str = "", image_path_on_server: str = "") -> ApiClient | None:
    client = connect(step, base_url=base_url, model=model)
    # the watchdog needs the profile's server: not for a server passed in by base_url
    with watching(step) if not base_url else contextlib.nullcontext():
        step.add(run_vision(step, client, image_path_on_server=image_path_on_server))
        step.add(run_battery(step, client))
    if client is not None:                   # a dry run sent nothing: no answers to judge
        step.add(garble_check(step, judged=judged(step.profile)))
    return client
