"""TCP socket facts: ``ss -tanp`` and a bounded TCP connect test (pure parsers).

``ss`` tells which rank is stuck connecting where (a worker's socket in ``SYN-SENT`` towards the
master port is the rendezvous that never reached the head); the connect test tells a firewall that
drops (``timeout``) from a port nobody listens on (``refused``) and a missing route (``unreachable``)
in seconds, long before vLLM's 600 s rendezvous timeout.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

SS_CMD = "ss -tanp 2>/dev/null || ss -tan"


@dataclass
class Socket:
    state: str            # "SYN-SENT", "ESTAB", "LISTEN", "TIME-WAIT", ...
    local_ip: str
    local_port: int
    peer_ip: str
    peer_port: int | None     # None for "*"
    process: str = ""         # 'python(pid 12261)'

    def describe(self) -> str:
        peer = f"{self.peer_ip}:{self.peer_port if self.peer_port is not None else '*'}"
        proc = f" {self.process}" if self.process else ""
        return f"{self.state} {self.local_ip}:{self.local_port} -> {peer}{proc}"


def _split_addr(addr: str) -> tuple[str, int | None]:
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    if host.startswith("::ffff:") and "." in host:      # IPv4-mapped on a dual-stack socket
        host = host[len("::ffff:"):]
    return host, int(port) if port.isdigit() else None


def parse_ss(text: str) -> list[Socket]:
    """Parse ``ss -tan[p]`` (with or without the header line). Sample (captured: a worker whose
    connect to the master port is dropped by the head's firewall)::

        State    Recv-Q Send-Q       Local Address:Port         Peer Address:Port Process
        SYN-SENT 0      1      [::ffff:10.213.0.2]:60866 [::ffff:10.213.0.1]:29501 users:(("python",pid=12261,fd=3))
        LISTEN   0      4096                     *:29501                   *:*     users:(("python",pid=12193,fd=12))
    """
    out = []
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) < 5 or not parts[1].isdigit() or not parts[2].isdigit():
            continue                              # header, comments, noise
        local_ip, local_port = _split_addr(parts[3])
        peer_ip, peer_port = _split_addr(parts[4])
        if local_port is None:
            continue
        users = re.findall(r'\("([^"]+)",pid=(\d+)', line)
        out.append(Socket(state=parts[0], local_ip=local_ip, local_port=local_port, peer_ip=peer_ip,
                          peer_port=peer_port,
                          process=", ".join(f"{name}(pid {pid})" for name, pid in users)))
    return out


def connecting_to(sockets: list[Socket], port: int) -> list[Socket]:
    """Sockets still in SYN-SENT towards ``port`` (a connect that gets no answer)."""
    return [s for s in sockets if s.state == "SYN-SENT" and s.peer_port == port]


# --------------------------------------------------------------------------- TCP connect test


def tcp_connect_cmd(host: str, port: int, timeout_s: int = 5) -> str:
    """One line ``tcp_connect HOST:PORT result=open|timeout|refused|unreachable|error rc=N ms=N
    <error text>``, bounded by ``timeout``; uses bash's ``/dev/tcp`` (no nc needed)."""
    h, p, t = shlex.quote(host), int(port), int(timeout_s)
    probe = shlex.quote(f"exec 3<>/dev/tcp/{host}/{p}")
    return (f"s=$(date +%s%N); out=$(timeout {t} bash -c {probe} 2>&1); rc=$?; "
            f"e=$(( ($(date +%s%N) - s) / 1000000 )); "
            f"case $rc in 0) r=open;; 124) r=timeout;; *) case \"$out\" in *refused*) r=refused;; "
            f"*unreachable*|*'No route'*) r=unreachable;; *) r=error;; esac;; esac; "
            f"printf 'tcp_connect %s:%s result=%s rc=%s ms=%s %s\\n' {h} {p} \"$r\" \"$rc\" \"$e\" "
            f"\"$(printf %s \"$out\" | tr '\\n' ' ' | cut -c1-200)\"")


@dataclass
class TcpConnect:
    host: str
    port: int
    result: str           # open | timeout | refused | unreachable | error
    rc: int
    ms: int
    detail: str = ""

    @property
    def dropped(self) -> bool:
        """No answer at all within the timeout: a firewall DROP (or a dead link)."""
        return self.result == "timeout"


def parse_tcp_connect(text: str) -> list[TcpConnect]:
    """Parse :func:`tcp_connect_cmd` lines. Samples (captured between two network namespaces)::

        tcp_connect 10.213.0.1:29501 result=timeout rc=124 ms=5020
        tcp_connect 10.213.0.1:29502 result=refused rc=1 ms=36 bash: connect: Connection refused ...
        tcp_connect 10.77.0.11:29501 result=unreachable rc=1 ms=13 bash: connect: Network is unreachable ...
    """
    out = []
    for m in re.finditer(r"^tcp_connect (\S+):(\d+) result=(\w+) rc=(\d+) ms=(\d+) ?(.*)$", text or "",
                         re.MULTILINE):
        out.append(TcpConnect(host=m.group(1), port=int(m.group(2)), result=m.group(3), rc=int(m.group(4)),
                              ms=int(m.group(5)), detail=m.group(6).strip()))
    return out
