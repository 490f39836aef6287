"""Step 01 — network verification: link, MTU, addressing, GID, RDMA, NCCL and TCP bandwidth.

    outcome = runbook.network.run(step, traffic=True, iperf_seconds=3)   # outcome.shown: the bandwidth figure

Check names → code (one ``<topic>_checks`` function per family; ``verify.py`` runs them in order):
``net.facts``/``fabric_if``/``hca``/``rails``/``path.*``: ``rails.py``; ``net.link``/``speed``/``pcie``/``addr``/
``route``/``rp_filter``/``mtu.*``: ``links.py``; ``net.gid*``, ``net.rdma.*``: ``rdma.py``; ``net.ping.*``,
``net.tcp.*``: ``ip_traffic.py``; ``net.tools`` (perftest, OpenMPI, nccl-tests: found, installed when allowed, or
a FAIL with the commands): ``tools.py``; ``net.nccl.*``, ``net.allreduce``: ``collectives.py``. The shared
state and probe helpers: ``context.py``; the bandwidth rows and chart: ``bandwidth.py``.
In a rehearsal the hardware-only tools are the simulators of ``runbook.lab.sim``, installed first (``step.site``).
"""
from __future__ import annotations

from ..step import StepOutcome
from .bandwidth import bandwidth_rows, plot_bandwidth
from .verify import verify_network


def run(step, *, traffic: bool = True, iperf_seconds: int = 3, install_tools: bool | None = None) -> StepOutcome:
    """Verify the fabric, archive every raw tool output, record the bandwidth rows; shows the bandwidth plot.
    ``install_tools`` (default: the profile's INSTALL_NET_TOOLS) lets the step install the network tools a
    node lacks (``tools.py``'s table) instead of failing with the commands."""
    if install_tools is None:
        install_tools = step.profile.install_net_tools
    step.add(step.site.install_simulators(step.cluster, step.profile))      # none on the Sparks
    net = verify_network(step.cluster, step.profile, traffic=traffic, iperf_seconds=iperf_seconds,
                         install_tools=install_tools, site=step.site)
    step.add(net.checks)
    step.archive(net.raw)
    step.record = net.record          # what 04 and the bench read (runbook.records.NetworkRecord)
    step.data["bandwidth"] = bandwidth_rows(net.checks)
    figure = plot_bandwidth(net.checks, step.profile)
    step.raw_dir.mkdir(parents=True, exist_ok=True)
    figure.savefig(step.raw_dir / "bandwidth.png", dpi=110, bbox_inches="tight")
    return step.outcome(figure)
