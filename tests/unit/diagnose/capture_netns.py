"""How the ``data/<scenario>/`` bundles were captured (not a test): run the real
:func:`runbook.diagnose.collect_commands` lines for each node inside a network namespace that
stands in for that node, and write ``<out>/<node>/<name>`` plus ``context.json``.

    sudo .venv/bin/python tests/unit/diagnose/capture_netns.py --profile env/lab.env \\
        --set HEAD_IP=10.214.0.11 --set WORKER_IP=10.213.0.2 \\
        --node head=diagtest-1-h --node worker=diagtest-1-w \\
        --state-dir head=/tmp/diagcap/mgmt_state --state-dir worker=/tmp/diagcap/mgmt_state \\
        --skip processes.txt --skip d_threads.txt --skip dmesg.txt --skip journal.txt --out /tmp/out

Network namespaces share the host's process table, kernel log and memory: ``--skip`` leaves out the
texts that would describe the host rather than the namespace (the capture notes say what replaced them).
"""
from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from runbook.diagnose import Context, collect_commands
from runbook.profile import load_profile


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", required=True)
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE profile override")
    ap.add_argument("--node", action="append", default=[], help="node=netns")
    ap.add_argument("--state-dir", action="append", default=[], help="node=dir")
    ap.add_argument("--skip", action="append", default=[])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    overrides = dict(s.split("=", 1) for s in a.set)
    profile = load_profile(a.profile, overrides)
    netns = dict(s.split("=", 1) for s in a.node)
    state = dict(s.split("=", 1) for s in a.state_dir)
    out = Path(a.out)
    for node, cmds in collect_commands(profile, state_dirs=state).items():
        if node not in netns:
            continue
        for c in cmds:
            if c.name in a.skip:
                continue
            try:
                r = subprocess.run(["ip", "netns", "exec", netns[node], "bash", "-c", c.cmd], capture_output=True,
                                   text=True, timeout=c.timeout)
                text = r.stdout + (r.stderr if r.stderr.strip() else "")
            except subprocess.TimeoutExpired:
                text = f"(timed out after {c.timeout} s)"
            p = out / node / c.name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    (out / "context.json").write_text(json.dumps(Context.from_profile(profile).to_dict(), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
