"""Firewall state of a node (nftables, iptables, ufw) and the rules that block a TCP port (pure).

One command prints the three views, each under a ``### <tool>`` marker; reading the ruleset
needs root, so it tries ``sudo -n`` first and says when it could not read.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

FIREWALL_CMD = ("echo '### nft'; (sudo -n nft list ruleset || nft list ruleset) 2>&1; "
                "echo '### iptables'; (sudo -n iptables-save || iptables-save) 2>&1; "
                "echo '### ufw'; (sudo -n ufw status verbose || ufw status verbose) 2>&1; true")


@dataclass
class Firewall:
    nft: str = ""
    iptables: str = ""
    ufw: str = ""
    ufw_active: bool = False
    ufw_default_deny_in: bool = False
    unreadable: list[str] = field(default_factory=list)   # tools whose state could not be read

    def blocking(self, port: int, iface: str = "") -> list[str]:
        """Rules that drop or reject TCP ``port`` on input (nft, iptables), and an active ufw that
        denies incoming by default with no ALLOW rule for the port (or a range holding it, or the
        whole ``iface``)."""
        out = []
        for line in self.nft.splitlines():
            s = line.strip()
            if re.search(rf"\bdport\s+(?:\{{[^}}]*\b{port}\b[^}}]*\}}|{port})\b", s) and \
                    re.search(r"\b(drop|reject)\b", s):
                out.append(f"nft: {s}")
        for line in self.iptables.splitlines():
            s = line.strip()
            if s.startswith("-A") and re.search(rf"--dports?\s+(?:\S*,)?{port}\b", s) and \
                    re.search(r"-j\s+(DROP|REJECT)\b", s):
                out.append(f"iptables: {s}")
        if self.ufw_active and self.ufw_default_deny_in and not self._ufw_allows(port, iface):
            out.append(f"ufw: active, default deny (incoming), no rule allows {port}/tcp"
                       + (f" or the interface {iface}" if iface else ""))
        return out

    def default_deny_input(self) -> str:
        """The rule that drops incoming traffic nothing else allows ('' when none): an nft input hook with
        ``policy drop``, iptables' ``:INPUT DROP``, or an active ufw that denies incoming by default."""
        for line in self.nft.splitlines():
            if re.search(r"\bhook\s+input\b.*\bpolicy\s+drop\b", line):
                return f"nft: {line.strip()}"
        for line in self.iptables.splitlines():
            if re.match(r"^:INPUT\s+DROP\b", line.strip()):
                return "iptables: INPUT policy DROP"
        if self.ufw_active and self.ufw_default_deny_in:
            return "ufw: active, default deny (incoming)"
        return ""

    def _ufw_allows(self, port: int, iface: str) -> bool:
        for line in self.ufw.splitlines():
            if "ALLOW" not in line:
                continue
            target = line.split("ALLOW")[0].strip()
            if iface and target == f"Anywhere on {iface}":
                return True
            for lo, hi in re.findall(r"^(\d+)(?::(\d+))?(?:/tcp)?(?:\s|$)", target):
                if int(lo) <= port <= int(hi or lo):
                    return True
        return False


def parse_firewall(text: str) -> Firewall:
    """Parse :data:`FIREWALL_CMD` output. Sample (captured in a network namespace with an nft drop
    rule; iptables-nft shows the same rule set)::

        ### nft
        table inet runbook_diag {
        \tchain input {
        \t\ttype filter hook input priority filter; policy accept;
        \t\ttcp dport 29501 drop
        \t}
        }
        ### iptables
        *filter
        :INPUT ACCEPT [0:0]
        -A INPUT -i enp1s0f0np0 -p tcp -m tcp --dport 29501 -j DROP
        COMMIT
        ### ufw
        Status: active
        Default: deny (incoming), allow (outgoing), disabled (routed)
    """
    sections: dict[str, list[str]] = {}
    cur = None
    for line in (text or "").splitlines():
        m = re.match(r"^### (nft|iptables|ufw)\s*$", line)
        if m:
            cur = m.group(1)
            sections[cur] = []
        elif cur:
            sections[cur].append(line)
    fw = Firewall(**{k: "\n".join(v) for k, v in sections.items()})
    err = re.compile(r"command not found|Operation not permitted|Permission denied|must be root|"
                     r"You need to be root|sudo: ")
    for tool in ("nft", "iptables", "ufw"):
        body = [l for l in getattr(fw, tool).splitlines() if l.strip()]
        if body and all(err.search(l) for l in body):      # only errors: the state is unknown, not empty
            fw.unreadable.append(tool)
    fw.ufw_active = bool(re.search(r"^Status: active", fw.ufw, re.MULTILINE))
    fw.ufw_default_deny_in = bool(re.search(r"^Default: (deny|reject) \(incoming\)", fw.ufw, re.MULTILINE))
    return fw
