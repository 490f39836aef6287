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
from ..api.server_info import ApiClient, connect
from ..api.watchdog import watching
from .cases import run_smoke


def run(step, *, base_url: str = "", model: str = "", concurrency: int = 0,
        context_lengths: list[int] | None = None, long_context: bool = True) -> ApiClient | None:
    """Step 05's entry: find the server (04's sidecar, or ``base_url``) and run every smoke case."""
    client = connect(step, base_url=base_url, model=model)
    with watching(step) if not base_url else contextlib.nullcontext():
        step.add(run_smoke(step, client, concurrency=concurrency, context_lengths=context_lengths,
                           long_context=long_context))
        step.add(run_gate(step, client))       # is the output right, not only fast (docs/quality.md)
    return client
