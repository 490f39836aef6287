"""Step 06 — vision and tool calls: the vision cases, then the tool-call battery, against the launched server; then the
garble detector over every answer the step received (docs/quality.md)."""
from __future__ import annotations

from ..answers.garble import garble_check
from ..answers.quality import judged
from .battery import run_battery
from ..api.session import step_session
from ..records import VisionToolsRecord
from ..step import StepOutcome
from .vision import run_vision


def run(step, *, base_url: str = "", model: str = "", image_path_on_server: str = "") -> StepOutcome:
    """Step 06's entry: the vision cases, the tool-call battery, then the garble row over every answer; rows,
    raw exchanges (``raw/06_vision_tools/``), data and record through the step. Shows the server it talked to
    (a ``ServerInfo``, None in a dry run); its client is closed when this returns, even on an exception."""
    profile, dry_run = step.profile, step.dry_run
    with step_session(profile, step.run.path, f"raw/{step.name}", add=step.add, keep=step.keep, dry_run=dry_run,
                      base_url=base_url, model=model) as (client, rec):
        server = client.server if client is not None else None
        if server is not None:
            step.data["server"] = server.describe()
        step.record = VisionToolsRecord.of(server)          # which start of the server these rows belong to
        step.add(run_vision(client, profile, rec, dry_run=dry_run, image_path_on_server=image_path_on_server))
        step.add(run_battery(client, profile, rec, dry_run=dry_run))
        if client is not None:               # a dry run sent nothing: no answers to judge
            step.add(garble_check(rec, judged=judged(profile)))
    return step.outcome(server)
