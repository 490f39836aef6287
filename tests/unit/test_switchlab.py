"""runbook.lab.switchlab: N namespace nodes on one bridge with jumbo frames. The root tests build real namespaces,
veths and a bridge (prefix swt*, subnets 10.79.x: never the embedded lab's nl-* / 10.77.0.0/24) and tear them down."""
from __future__ import annotations

import os
import subprocess

import pytest

from runbook.errors import LabError
from runbook.lab import switchlab
from runbook.lab.netlab.host import link_exists, netns_exists

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


@pytest.mark.parametrize("kwargs, says", [
    ({"prefix": "nl4", "subnet": "10.79.0"}, "embedded lab"),
    ({"prefix": "FN4", "subnet": "10.79.0"}, "not usable"),
    ({"prefix": "toolongprefix", "subnet": "10.79.0"}, "not usable"),
    ({"prefix": "swt", "subnet": "10.79"}, "first three octets"),
    ({"prefix": "swt", "subnet": "8.8.8"}, "not private"),
    ({"prefix": "swt", "subnet": "10.79.0", "mtu": 20000}, "out of range"),
])
def test_bad_switch_refused_before_anything(kwargs, says):
    with pytest.raises(LabError, match=says) as err:
        switchlab.Switch(**kwargs)
    assert err.value.fix


def test_names_and_addresses():
    sw = switchlab.Switch("fn4", "10.78.0")
    assert (sw.bridge, sw.host_ip, sw.netns(4), sw.port(4), sw.node_ip(1), sw.node_ip(4)) == \
        ("fn4sw0", "10.78.0.1", "fn4-n4", "fn4-p4", "10.78.0.11", "10.78.0.14")
    assert switchlab.node_argv(sw, 2, ["ping", "x"]) == ["ip", "netns", "exec", "fn4-n2", "ping", "x"]


@pytest.mark.parametrize("nodes, kw, says", [
    (1, {}, "1 nodes is not supported"),
    (17, {}, "17 nodes is not supported"),
    (4, {"node_mtu": {5: 1500}}, "node_mtu"),
    (4, {"port_mtu": {2: 9500}}, "port_mtu"),
])
def test_bad_up_refused_before_anything(nodes, kw, says):
    sw = switchlab.Switch("swtz", "10.79.9")
    with pytest.raises(LabError, match=says):
        switchlab.up(sw, nodes, **kw)
    assert not link_exists(sw.bridge) and not switchlab.existing_nodes(sw)


@pytest.fixture
def switch():
    sw = switchlab.Switch("swt", "10.79.0")
    switchlab.down(sw)
    yield sw
    switchlab.down(sw)
    assert not switchlab.existing_nodes(sw) and not link_exists(sw.bridge)


@root_only
@pytest.mark.slow
def test_four_nodes_every_pair_passes_jumbo_frames_and_up_is_idempotent(switch):
    assert switchlab.up(switch, 4) == [f"swt-n{k}" for k in range(1, 5)]
    sleeper = subprocess.Popen(switchlab.node_argv(switch, 1, ["sleep", "120"]))
    try:
        switchlab.up(switch, 4)                      # again: nothing rebuilt, node 1's process stays
        switchlab.up(switch, 5)                      # a fifth node joins without touching the others
        assert sleeper.poll() is None
        rows = switchlab.pair_checks(switch, 5)
        paths = [r for r in rows if r.name.startswith("switch.path.")]
        assert len(paths) == 10 and len(rows) == 15  # N(N-1)/2 pairs + one MTU row per node
        assert [r for r in rows if r.failed] == [], [(r.name, r.observed) for r in rows if r.failed]
        assert switchlab.failing_nodes(rows) == []
        assert all("0% packet loss" in r.observed for r in paths)
    finally:
        removed = switchlab.down(switch)             # kills what runs in the namespaces, then removes them
    assert sleeper.wait(timeout=10) != 0
    assert "swt-n5" in removed and "swtsw0" in removed
    assert not any(netns_exists(f"swt-n{k}") for k in range(1, 6))


@root_only
@pytest.mark.slow
@pytest.mark.parametrize("where, says", [("port_mtu", "switch port swt-p3 MTU 1500"),
                                         ("node_mtu", "node NIC swt-n3:enp1s0f0np0 MTU 1500")])
def test_a_node_left_at_1500_is_named(switch, where, says):
    switchlab.up(switch, 4, **{where: {3: 1500}})
    rows = switchlab.pair_checks(switch, 4)
    failed = {r.name: r for r in rows if r.failed}
    assert sorted(failed) == ["switch.mtu.n3", "switch.path.n1-n3", "switch.path.n2-n3", "switch.path.n3-n4"]
    assert all(says in r.fix for r in failed.values())
    assert switchlab.failing_nodes(rows) == [3]


@root_only
def test_subnet_already_on_another_link_is_refused(switch):
    switchlab.up(switch, 2)
    other = switchlab.Switch("swtb", switch.subnet)
    with pytest.raises(LabError, match="already on swtsw0"):
        switchlab.up(other, 2)
    assert not link_exists(other.bridge) and not switchlab.existing_nodes(other)
