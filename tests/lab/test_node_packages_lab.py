"""A lab node's own packages, and step 01's install path (INSTALL_NET_TOOLS=1) succeeding for real on the lab.

Each node's /usr, /etc and /var are overlays over this machine's (runbook/lab/nodeinit.sh), and its apt reaches the
Debian archive only through the lab's apt proxy on the bridge (runbook/lab/netlab/aptproxy.py). Here perftest is
purged on the head alone, the runbook's own ``net.tools`` row runs with install on as the non-root operator (sudo
refuses first; with exactly the drop-in the row prescribes, ``sudo -n apt-get install -y perftest`` downloads the
package through the proxy and dpkg installs it in the head's own /usr), and the row PASSes, while the worker and
this machine keep their perftest untouched throughout. The head ends with perftest again, as before.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from runbook.checks import Status
from runbook.lab.netlab import aptproxy
from runbook.lab.netlab.spec import APT_PROXY, APT_PROXY_CONF, OPERATOR
from runbook.network import tools
from runbook.profile import load_profile
from runbook.remote import Cluster, quote

pytestmark = [pytest.mark.lab, pytest.mark.skipif(os.geteuid() != 0, reason="the netns lab needs root")]
LAB_ENV = Path(__file__).resolve().parents[2] / "env" / "lab.env"
QUERY = "dpkg-query -W -f '${Status} ${Version}' perftest"
APT = "DEBIAN_FRONTEND=noninteractive apt-get -q"


@pytest.fixture(scope="module")
def clusters(lab):
    """The lab's nodes as the operator and as root (the same nodes, the same key)."""
    as_op = load_profile(LAB_ENV, {"HEAD_SSH": f"{OPERATOR}@spark-head", "WORKER_SSH": f"{OPERATOR}@spark-worker"})
    with Cluster.from_profile(as_op) as op, Cluster.from_profile(load_profile(LAB_ENV)) as root:
        yield as_op, op, root


def this_machine() -> tuple[str, tuple[int, int, int]]:
    """perftest on this machine: dpkg's status and version, and ib_write_bw's inode, size and mtime."""
    got = subprocess.run(["sh", "-c", QUERY], capture_output=True, text=True, timeout=30)
    st = Path("/usr/bin/ib_write_bw").stat()
    return got.stdout, (st.st_ino, st.st_size, st.st_mtime_ns)


def test_a_node_installs_perftest_through_the_lab_proxy_without_touching_the_host_or_the_other_node(lab, clusters):
    as_op, op, root = clusters
    head, worker = root.head, root.worker
    host_before = this_machine()
    assert host_before[0].startswith("install ok installed "), host_before      # the lab's packages: perftest here
    version = host_before[0].split()[-1]
    size = subprocess.run(["apt-cache", "show", f"perftest={version}"], capture_output=True, text=True,
                          timeout=60).stdout.split("\nSize: ", 1)[1].split()[0]
    # before anything is removed: each node's dpkg database and /usr are its own (on the lab of before, a purge
    # here was this machine's)
    for node in root:
        fs = node.read("stat -f -c %T /usr /var/lib/dpkg /etc/alternatives", timeout=20).stdout.split()
        assert fs == ["overlayfs"] * 3, (node.name, fs)
        assert node.read(QUERY, timeout=20).stdout == host_before[0]
        said = node.read("apt-config shell P Acquire::http::Proxy", timeout=20).stdout.strip()
        assert said == f"P='http://{APT_PROXY}/'", (node.name, said)           # the node-private apt line
    assert not Path(APT_PROXY_CONF).exists()                                  # this machine's apt: as it was
    requests = aptproxy.proxy_paths(lab.lab_dir)["requests"]
    seen = requests.stat().st_size if requests.exists() else 0
    try:
        head.run(f"{APT} purge -y perftest", timeout=300)
        # the head's own .deb cache emptied too: the install below must fetch through the proxy (a run right after
        # another kept the .deb in /var/cache/apt/archives, and apt installed it without asking anyone)
        head.run(f"{APT} clean", timeout=120)
        assert not head.read("command -v ib_write_bw", timeout=20).ok
        assert worker.read("command -v ib_write_bw", timeout=20).stdout.strip() == "/usr/bin/ib_write_bw"
        assert this_machine() == host_before

        found = tools.locate(op.head, as_op, need_perftest=True, need_nccl=False)
        assert found.missing(True, False) == ["ib_write_bw", "ib_write_lat"], found
        cmds = tools.install_commands(found, True, False)
        assert cmds == ["sudo -n apt-get install -y perftest"], cmds
        refused = tools.tools_check(op.head, found, need_perftest=True, need_nccl=False, install=True)
        assert refused.failed and "sudo refuses `apt-get install -y perftest`" in refused.observed, refused
        line = tools.net_tools_sudoers_line(OPERATOR, cmds)
        assert line in refused.fix
        path = tools.NET_TOOLS_SUDOERS
        head.run(f"printf '%s\\n' {quote(line)} > {path} && chmod 0440 {path} && visudo -cf {path}", timeout=20)
        row = tools.tools_check(op.head, found, need_perftest=True, need_nccl=False, install=True)
        assert row.status == Status.PASS, row
        assert row.observed == "installed ib_write_bw, ib_write_lat: perftest (apt-get)", row.observed

        # downloaded through the lab host: the proxy handed the head the archive's .deb, whole
        lines = [line.split() for line in requests.read_text().splitlines()] if requests.exists() else []
        fetched = [f for f in lines[_lines_before(requests, seen):]
                   if f[1] == lab.head.mgmt_ip and f[2] == "GET" and "/pool/main/p/perftest/perftest_" in f[3]]
        assert fetched and fetched[-1][4:6] == ["200", size] and fetched[-1][6] in ("archive", "cache"), fetched
        # installed in the head's own dpkg and /usr
        assert head.read(QUERY, timeout=20).stdout == host_before[0]
        assert op.head.read("command -v ib_write_bw", timeout=20).stdout.strip() == "/usr/bin/ib_write_bw"
        again = tools.locate(op.head, as_op, need_perftest=True, need_nccl=False)
        assert again.missing(True, False) == [] and again.found["ib_write_lat"] == "/usr/bin/ib_write_lat"
        # the worker and this machine: untouched throughout
        assert worker.read(QUERY, timeout=20).stdout == host_before[0]
        assert this_machine() == host_before
    finally:
        head.run(f"rm -f {tools.NET_TOOLS_SUDOERS}", timeout=20, warn=True)
        if not head.read("command -v ib_write_bw", timeout=20).ok:          # a failure above: perftest back
            head.run(f"{APT} install -y perftest", timeout=600, warn=True)
    assert head.read(QUERY, timeout=20).stdout == host_before[0]              # the lab as before
    assert not head.read(f"test -e {tools.NET_TOOLS_SUDOERS}", timeout=20).ok


def _lines_before(requests: Path, offset: int) -> int:
    """How many request lines the log held at byte ``offset`` (the lines this test added follow them)."""
    if not requests.exists():
        return 0
    with open(requests, "rb") as f:
        return f.read(offset).count(b"\n")
