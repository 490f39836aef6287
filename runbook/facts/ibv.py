"""``ibv_devinfo`` port facts (pure parser): state, link layer and the RoCE *active* MTU.

The netdev MTU (9000) and the RoCE path MTU are different things: a RoCE port whose
``active_mtu`` is 1024 instead of 4096 moves a quarter of the payload per packet and prefill
runs ~40 % low. Compare both ends, not only ``ip link``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

IBV_DEVINFO_CMD = "ibv_devinfo 2>&1"


@dataclass
class IbvPort:
    hca: str
    port: int
    state: str = ""           # "PORT_ACTIVE"
    max_mtu: int | None = None
    active_mtu: int | None = None
    link_layer: str = ""

    @property
    def active(self) -> bool:
        return self.state == "PORT_ACTIVE"


def parse_ibv_devinfo(text: str) -> list[IbvPort]:
    """Parse ``ibv_devinfo`` (rdma-core). Sample (tabs; one HCA, one port)::

        hca_id:\trocep1s0f0
        \ttransport:\t\t\tInfiniBand (0)
        \tfw_ver:\t\t\t\t28.45.4028
        \tphys_port_cnt:\t\t\t1
        \t\tport:\t1
        \t\t\tstate:\t\t\tPORT_ACTIVE (4)
        \t\t\tmax_mtu:\t\t4096 (5)
        \t\t\tactive_mtu:\t\t1024 (3)
        \t\t\tlink_layer:\t\tEthernet
    """
    out: list[IbvPort] = []
    hca = ""
    cur: IbvPort | None = None
    for line in (text or "").splitlines():
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue
        value = value.strip()
        if key == "hca_id":
            hca, cur = value, None
        elif key == "port" and hca and value.isdigit():
            cur = IbvPort(hca=hca, port=int(value))
            out.append(cur)
        elif cur is None:
            continue
        elif key == "state":
            cur.state = value.split()[0]
        elif key in ("max_mtu", "active_mtu"):
            m = re.match(r"(\d+)", value)
            setattr(cur, key, int(m.group(1)) if m else None)
        elif key == "link_layer":
            cur.link_layer = value
    return out
