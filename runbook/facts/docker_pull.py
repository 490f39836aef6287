"""Classify a failed ``docker pull`` from its output (pure): retry it, stop, or fix DNS.

``unexpected EOF`` is a dropped connection mid-layer: the pull resumes from the layers it has, so
retrying is right -- unless it comes from registering (unpacking) a layer: that is a full disk, and a retry fails
the same way. ``manifest unknown`` means the tag or digest does not exist in that registry:
retrying never helps. ``no such host`` is name resolution on the node, not the registry. ``connection
refused`` is the registry's address: nothing listens there (the registry is down, or the port is wrong).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

#: (kind, action, pattern, what it means); the first match wins, most specific first
PULL_ERRORS: tuple[tuple[str, str, str, str], ...] = (
    # extracting a layer, not downloading it: the daemon's own write failed. "failed to register layer: …
    # unexpected EOF" is what a full data root gives while a layer is unpacked (issue 36's report); a retry
    # downloads the layer again and fails the same way
    ("disk", "stop", r"no space left on device|failed to register layer|failed to extract layer",
     "the node's docker data root (or its tmp) ran out of space while a layer was written or unpacked: "
     "free space there (docker system df; docker image prune) before pulling again"),
    ("manifest-unknown", "stop", r"manifest unknown|manifest for \S+ not found|not found: manifest",
     "the tag or digest does not exist in that registry (typo, or the tag was never pushed / was deleted)"),
    # Go's resolver error (net/net.go DNSError: "lookup <host> on <server>: <err>"): the resolver itself timed out
    # or refused, e.g. "lookup registry-1.docker.io on 8.8.8.8:53: read udp ...: i/o timeout" (not a registry timeout)
    ("dns", "fix-dns", r"no such host|Temporary failure in name resolution|server misbehaving|"
     r"lookup \S+ on \S+:53: [^\n]*(?:i/o timeout|connection refused)",
     "the node cannot resolve the registry's host name"),
    ("unreachable", "fix-registry",
     r"dial tcp \S+: connect: (?:connection refused|no route to host|network is unreachable)",
     "nothing answers at the registry's address: the registry is down, or the host or port is wrong, or a "
     "firewall rejects the connection"),
    ("unexpected-eof", "retry", r"unexpected EOF|connection reset by peer|http2: server sent GOAWAY",
     "the connection dropped mid-download; a new pull resumes from the layers already fetched"),
    ("timeout", "retry", r"i/o timeout|TLS handshake timeout|context deadline exceeded|"
     r"Client\.Timeout exceeded", "the registry did not answer in time"),
    ("rate-limit", "wait", r"toomanyrequests|rate limit", "the registry's pull rate limit was reached"),
    ("auth", "stop", r"unauthorized|authentication required|denied: requested access|pull access denied",
     "the registry refused the credentials (or the repository is private / does not exist)"),
)


@dataclass
class PullError:
    kind: str
    action: str       # retry | stop | fix-dns | fix-registry | wait
    meaning: str
    line: str


def classify_pull(text: str) -> PullError | None:
    """The first recognised error in ``docker pull`` output, or None (no error seen). Sample::

        Error response from daemon: manifest for nvcr.io/nvidia/vllm:26.13-py3 not found: manifest unknown: manifest unknown
    """
    lines = (text or "").splitlines()
    for kind, action, pattern, meaning in PULL_ERRORS:
        rx = re.compile(pattern, re.IGNORECASE)
        for line in lines:
            if rx.search(line):
                return PullError(kind, action, meaning, line.strip()[:400])
    return None
