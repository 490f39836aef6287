"""Diagnose the launched (or failed) server: the texts only the launch step knows (the rendered plan, the
API's answers), the bundle from every node (``runbook.diagnose``), and rows for the step's table.

    archive, findings = diagnose_server(cluster, profile, run_dir, redactor, plan=plan)
    step.add(finding_checks(findings, archive, run_dir))

Used by ``python -m runbook diagnose`` and, automatically, by 04_launch when the start failed.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..checks import Check, Status
from ..errors import RunbookError
from ..diagnose import LOCAL, Finding
from ..diagnose import bundle as B
from ..diagnose.collect import diagnose
from ..secrets import Redactor, load_secrets
from ..api.server_info import ApiClient, ServerInfo
from .render import LaunchPlan
from ..api.endpoint import base_url

METRICS_INTERVAL_S = 10.0   # the wedge check needs >= 10 s between the two samples


def api_texts(profile, *, interval_s: float = METRICS_INTERVAL_S) -> tuple[dict[str, str], dict[str, float]]:
    """/health, /v1/models and two /metrics samples ``interval_s`` apart (the wedge check compares them)."""
    texts: dict[str, str] = {}
    try:
        server = ServerInfo(base_url(profile), profile.served_model_name, api_key=load_secrets().api_key)
    except RunbookError as exc:         # the SSH forward to a loopback-bound API could not open
        texts[B.LOCAL_HEALTH] = exc.what
        return texts, {}
    with ApiClient(server, timeout=10) as api:
        health = api.get("/health")
        texts[B.LOCAL_HEALTH] = str(health.status) if health.status is not None else health.error
        if health.status is None:
            return texts, {}
        models = api.get("/v1/models")
        texts[B.LOCAL_MODELS] = json.dumps(models.body) if models.status is not None else models.error
        first = api.get("/metrics")
        time.sleep(interval_s)
        second = api.get("/metrics")
    texts[B.LOCAL_METRICS_1] = first.body if isinstance(first.body, str) else str(first.body or first.error)
    texts[B.LOCAL_METRICS_2] = second.body if isinstance(second.body, str) else str(second.body or second.error)
    return texts, {"metrics_interval_s": interval_s}


def diagnose_server(cluster, profile, run_dir: str | Path, redactor: Redactor, *,
                    plan: LaunchPlan | None = None, pulls: dict[str, str] | None = None) -> tuple[Path, list[Finding]]:
    """``pulls``: node -> the output of its failed ``docker pull`` (the image step's), into that node's bundle."""
    local, timings = api_texts(profile)
    if plan is not None:
        local[B.LOCAL_LAUNCH_PLAN] = plan.to_text()
    commands = Path(run_dir) / "commands.jsonl"
    if commands.is_file():
        local[B.LOCAL_COMMANDS] = commands.read_text(errors="replace")[-(4 << 20):]
    state_dirs = {r.node: r.state_dir for r in plan.ranks} if plan is not None else None
    return diagnose(cluster, profile, run_dir, redactor, local=local, state_dirs=state_dirs, timings=timings,
                    extra={node: {B.DOCKER_PULL: text} for node, text in (pulls or {}).items()})


def failed_pulls(image_checks) -> dict[str, str]:
    """node -> the output of each ``docker pull`` that stopped the image step (what the catalogue's docker-pull
    rows match); {} when the image step passed, also when a worker's failed pull was made up for by shipping the
    head's image (its WARN row says so)."""
    if image_checks is None or not image_checks.failures():
        return {}
    return dict(image_checks.data.get("pull_failed") or {})


def finding_checks(findings: list[Finding], archive: Path, run_dir: str | Path) -> list[Check]:
    """One WARN row per matched catalogue entry (the step already failed or this is a report; a match is
    an explanation for a human, named by its catalogue id)."""
    rel = str(Path(archive).relative_to(run_dir)) if Path(archive).is_relative_to(run_dir) else str(archive)
    if not findings:
        return [Check("diagnose", node="cluster", status=Status.PASS, observed="no known failure matched",
                      expected="no catalogue entry matches", evidence=[rel])]
    return [Check(f"diagnose.{f.id}", node=f.node or LOCAL, status=Status.WARN, observed=f"{f.title}: {f.cause}",
                  expected="no catalogue entry matches", fix=f"{f.fix} (proof: {f.proof})", evidence=[rel],
                  data={"severity": f.severity, "evidence": f.evidence[:5]}) for f in findings]
