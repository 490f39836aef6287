"""Step 01 on a switch (issue 39): every pair of three or more nodes on one subnet answers a DF ping at the fabric
MTU, and a node whose every pair is lost is named -- its switch port when its own NIC has the MTU (a switch port
left at 1500 drops jumbo frames silently: the sender sees only loss)."""
from __future__ import annotations

import itertools

from runbook.checks import Status, check, first_fix
from runbook.facts import net as fnet
from runbook.network.context import NetFacts, Rail, RailEnd, Verification
from runbook.network.ip_traffic import short_ends, switch_checks
from support.doubles import FakeCluster, FakeNode
from support.profiles import profile_from

NAMES = ["head", "worker", "worker2", "worker3"]


def answered(lost_node: str | None = None, names=NAMES) -> dict[tuple[str, str], bool]:
    return {(a, b): lost_node not in (a, b) for a, b in itertools.permutations(names, 2)}


def test_the_node_in_every_lost_pair_is_the_short_end():
    assert answered() and short_ends(NAMES, answered()) == []
    assert short_ends(NAMES, answered("worker2")) == ["worker2"]
    assert short_ends(NAMES, {k: False for k in answered()}) is None          # nothing through: the switch
    one_pair = {**answered(), ("head", "worker"): False, ("worker", "head"): False}
    assert short_ends(NAMES, one_pair) == []                                  # a cable, not one node's port


def ctx_with(nic_mtu: dict[str, int]) -> tuple[Verification, Rail]:
    cluster = FakeCluster([FakeNode(n, r, fabric_ip=f"169.254.30.{r + 1}", fabric_if="enp1s0f0np0", rules=[],
                                    read_only=True) for r, n in enumerate(NAMES)])
    ctx = Verification(cluster, profile_from("env/lab.env", FABRIC_MTU=9000), None)
    for r, n in enumerate(NAMES):
        ctx.facts[n] = NetFacts(ifaces={"enp1s0f0np0": fnet.Interface("enp1s0f0np0", state="UP",
                                                                       mtu=nic_mtu.get(n, 9000),
                                                                       ipv4=[f"169.254.30.{r + 1}/24"])})
    return ctx, Rail(0, {n: RailEnd(n, "enp1s0f0np0", f"169.254.30.{r + 1}") for r, n in enumerate(NAMES)})


def test_a_switch_port_left_at_1500_is_named():
    ctx, rail = ctx_with({})
    switch_checks(ctx, rail, answered("worker2"), 8972)
    row = ctx.checks[-1]
    assert row.name == "net.switch.rail0" and row.status is Status.FAIL
    assert "worker2 enp1s0f0np0: NIC MTU 9000, so its switch port drops 8972-byte frames" in row.observed
    assert "6 of 12 DF pings lost" in row.observed
    assert row.fix.startswith("set MTU 9000 on the switch port worker2's enp1s0f0np0 is plugged into")
    assert row.data["short"] == ["worker2"] and row.cause == "fabric"
    lost_ping = check("net.ping.rail0.head->worker2", False, fix="check link, addresses and MTU")
    assert first_fix([("01_network", [lost_ping, row])])[1] is row        # the switch port, not the first ping


def test_a_short_nic_is_named_as_the_nic():
    ctx, rail = ctx_with({"worker3": 1500})
    switch_checks(ctx, rail, answered("worker3"), 8972)
    row = ctx.checks[-1]
    assert row.status is Status.FAIL and "worker3 enp1s0f0np0: NIC MTU 1500" in row.observed
    assert row.fix == "set MTU 9000 on worker3's enp1s0f0np0"


def test_every_pair_through_passes():
    ctx, rail = ctx_with({})
    switch_checks(ctx, rail, answered(), 8972)
    row = ctx.checks[-1]
    assert row.status is Status.PASS and row.observed.startswith("6 pairs of 4 nodes answer 8972-byte DF pings")
