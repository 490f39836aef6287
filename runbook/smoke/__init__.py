"""Step 05 — smoke: the launched server answers (models, chat, streaming, context limits, needles,
speculative decoding, the API key), then the quality gate.

    client = runbook.smoke.run(step, base_url="", model="", concurrency=0)

Check names → code: ``server.*``, ``health``, ``models.*``, ``chat.*``, ``context.*``, ``spec_decode.*``,
``auth.*`` in ``cases.py``; ``quality.*`` in ``answers/quality.py``; ``serving watchdog`` in
``api/watchdog.py``.
"""
from __future__ import annotations

import contextlib

from ..answers.quality import run_gate
from ..api.server_info import ApiClient, Archive, connect
from ..api.watchdog import watching
from .cases import run_smoke


def run(step, *, base_url: str = "", model: str = "", concurrency: int = 0,
        context_lengths: list[int] | None = None, long_context: bool = True) -> ApiClient | None:
    """Step 05's entry: find the server (04's sidecar, or ``base_url``), run every smoke case and the quality
    gate, and record their rows, raw exchanges (``raw/05_smoke/``) and data through the step."""
    profile, dry_run = step.profile, step.dry_run
    client = connect(profile, step.run.path, dry_run=dry_run, base_url=base_url, model=model)
    if client is not None:
        step.data["server"] = client.server.describe()
    rec = Archive(f"raw/{step.name}")
    try:
        # the watchdog needs the profile's server: not for a server passed in by base_url
        with watching(profile, step.add, dry_run=dry_run) if not base_url else contextlib.nullcontext():
            step.add(run_smoke(client, profile, rec, dry_run=dry_run, concurrency=concurrency,
                               context_lengths=context_lengths, long_context=long_context))
            # is the output right, not only fast (docs/quality.md); its garble row reads the smoke answers too
            step.add(run_gate(client, profile, rec, dry_run=dry_run))
    finally:                                 # what was asked before a crash is evidence too
        step.archive(rec.files)
        step.data.update(rec.data)
    return client
