"""The remote layer over real SSH on the lab: an environment value (the API key) reaches the command but
never the node's process table."""
from __future__ import annotations

import threading
import time

import pytest

from runbook.profile import load_profile
from runbook.remote import Cluster

pytestmark = [pytest.mark.lab]
PLANTED = "sk-planted-4f0c9b7e"


def test_env_values_reach_the_command_but_not_ps(lab):
    profile = load_profile("env/lab.env")
    with Cluster.from_profile(profile) as cluster, Cluster.from_profile(profile) as watcher:
        out = {}

        def run():
            out["res"] = cluster.head.run('sleep 3; printf %s "$VLLM_API_KEY"', env={"VLLM_API_KEY": PLANTED},
                                          timeout=30)
        thread = threading.Thread(target=run)
        thread.start()
        seen = []
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:        # the process table while the command runs
            seen.append(watcher.head.read("ps -eo args", timeout=10).stdout)
            time.sleep(0.2)
        thread.join(timeout=30)
    assert out["res"].stdout == PLANTED                       # the value arrived
    assert seen and any("sleep 3" in table for table in seen), "the command was not seen running"
    assert not [t for t in seen if PLANTED in t]              # and was never on a command line
    assert PLANTED not in out["res"].command
