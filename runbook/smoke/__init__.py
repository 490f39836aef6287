"""Step 05 — smoke: the launched server answers (models, chat, streaming, context limits, needles,
speculative decoding, the API key), then the quality gate.

    outcome = runbook.smoke.run(step, base_url="", model="", concurrency=0)   # shows the server; its client is closed after

Check names → code: ``server.*``, ``health``, ``models.*``, ``chat.*``, ``context.*``, ``spec_decode.*``,
``auth.*`` in ``cases.py``; ``quality.*`` in ``answers/quality.py``; ``serving watchdog`` in
``api/watchdog.py``.
"""
from __future__ import annotations

from ..answers.quality import run_gate
from ..api.session import step_session
from ..records import SmokeRecord
from ..step import StepOutcome
from .cases import run_smoke


def run(step, *, base_url: str = "", model: str = "", concurrency: int = 0,
        context_lengths: list[int] | None = None, long_context: bool = True) -> StepOutcome:
    """Step 05's entry: find the server (04's record, or ``base_url``), run every smoke case and the quality
    gate, and record their rows, raw exchanges (``raw/05_smoke/``), data and record through the step. Shows the
    server it talked to (a ``ServerInfo``, None in a dry run); its client is closed when this returns, even on an
    exception."""
    profile, dry_run = step.profile, step.dry_run
    with step_session(profile, step.run.path, f"raw/{step.name}", add=step.add, keep=step.keep, dry_run=dry_run,
                      base_url=base_url, model=model) as (client, rec):
        server = client.server if client is not None else None
        if server is not None:
            step.data["server"] = server.describe()
        step.record = SmokeRecord.of(server)          # which start of the server these rows belong to
        step.add(run_smoke(client, profile, rec, dry_run=dry_run, concurrency=concurrency,
                           context_lengths=context_lengths, long_context=long_context))
        # is the output right, not only fast (docs/quality.md); its garble row reads the smoke answers too
        step.add(run_gate(client, profile, rec, dry_run=dry_run))
    return step.outcome(server)
