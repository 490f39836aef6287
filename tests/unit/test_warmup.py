"""The recipes' boot-shape warm-up after readiness (issue #22 risk: recipe B's P0 #117, a mid-serve JIT stalls one
rank past NCCL's 600 s watchdog). Run for real: a local bash node with a checkout whose warm-up script records
the arguments and environment it got."""
from __future__ import annotations

import json

import pytest

from runbook.checks import Status
from runbook.launch import warmup
from runbook.profile import REPO_ROOT, load_profile
from support.doubles import FakeCluster, local_pair

RECORDER = """#!/usr/bin/env bash
python3 - "$@" <<'PY' > "$HOME/warmup-call.json"
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items()
                                               if k.startswith(("GLM53_WARMUP", "DSPARK_WARMUP", "VLLM_API_KEY"))}}))
PY
echo "boot-shape-warmup: 13/13 requests ok"
exit ${WARMUP_EXIT:-0}
"""


def _cluster(tmp_path, profile, script: str | None):
    head, worker = local_pair(tmp_path)
    if script is not None:
        d = head.home / profile.recipe_dir.removeprefix("~/") / "scripts"
        d.mkdir(parents=True)
        (d / "boot-shape-warmup.sh").write_text(script)
    return FakeCluster([head, worker]), head


@pytest.mark.parametrize("name,knobs", [
    ("exl3-v41", {"GLM53_WARMUP_MAX_CONCURRENCY": "2", "GLM53_WARMUP_DSPARK_K": "3", "GLM53_WARMUP_REQ_TIMEOUT": "240"}),
    ("dspark-v4", {"DSPARK_WARMUP_MAX_CONCURRENCY": "6", "DSPARK_WARMUP_REQ_TIMEOUT": "240"}),
])
def test_the_recipes_warmup_runs_on_the_head_with_its_launchers_knobs(tmp_path, name, knobs):
    profile = load_profile(REPO_ROOT / "env" / f"{name}.env")
    cluster, head = _cluster(tmp_path, profile, RECORDER)
    row = warmup.run_warmup(cluster, profile, api_key="sk-warm-secret")
    assert row.status is Status.PASS, row.observed
    call = json.loads((head.home / "warmup-call.json").read_text())
    assert call["argv"] == [f"http://127.0.0.1:{profile.port}", profile.served_model_name]
    assert {k: call["env"].get(k) for k in knobs} == knobs
    key_env = "VLLM_API_KEY" if name == "exl3-v41" else "DSPARK_WARMUP_BEARER"
    assert call["env"][key_env] == "sk-warm-secret"
    assert "sk-warm-secret" not in row.data["command"]          # the key travels in the environment only
    cache = [v for k, v in call["env"].items() if k.endswith("TRITON_CACHE_DIR")]
    assert cache and cache[0].startswith(str(head.home))


def test_a_failing_or_absent_warmup_is_a_warning_not_a_failure(tmp_path):
    profile = load_profile(REPO_ROOT / "env" / "exl3-v41.env")
    cluster, _ = _cluster(tmp_path, profile, RECORDER.replace("${WARMUP_EXIT:-0}", "1"))
    assert warmup.run_warmup(cluster, profile).status is Status.WARN
    cluster, _ = _cluster(tmp_path / "none", profile, None)
    row = warmup.run_warmup(cluster, profile)
    assert row.status is Status.WARN and "not in the pinned checkout" in row.observed


def test_the_lab_recipe_has_no_warmup():
    assert warmup.warmup_command(load_profile(REPO_ROOT / "env" / "lab.env"), "/home/x") is None
