"""The lab's apt proxy: the nodes reach the Debian archive only through this machine, a small forward proxy
(``forward_proxy``) in its own process on the management bridge's host address, to the hosts of this machine's apt
sources only, ``.deb`` files kept under ``<lab_dir>/aptproxy/cache``; started by ``up``, stopped by ``down``, a row
of ``status``.

The nodes have no default route, so without it a node's ``apt-get install`` (step 01's INSTALL_NET_TOOLS=1) could
only fail. Each node's apt is told to use it by a node-private ``apt.conf.d`` file (:func:`node_apt_conf`, which
nodeinit.sh writes into the node's /etc overlay); this machine's apt configuration is untouched. It substitutes a
network path only: on a Spark apt reaches its mirror directly, and what the node installs (dpkg, its scripts and
triggers, in the node's own /usr, /etc and /var) is real.
"""
from __future__ import annotations

import contextlib
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import runbook
from runbook.errors import LabError

from .hostservice import HostService
from .spec import APT_PROXY, APT_PROXY_HEADER, Log

SERVER_MODULE = "runbook.lab.netlab.forward_proxy"      # run with -m, never imported here
SOURCES = Path("/etc/apt")


def proxy_paths(lab_dir: Path) -> dict[str, Path]:
    """Where the proxy keeps its cache, request log, pid and output (all under ``<lab_dir>/aptproxy``)."""
    root = lab_dir / "aptproxy"
    return {"root": root, "cache": root / "cache", "requests": root / "requests.log", "pid": root / "aptproxy.pid",
            "log": root / "aptproxy.log"}


def node_apt_conf(addr: str = APT_PROXY) -> str:
    """The node-private apt.conf.d file (spec.APT_PROXY_CONF): every http and https source through the proxy."""
    return ("// runbook.lab.netlab: this lab node reaches the Debian archive only through the lab host's apt proxy\n"
            f'Acquire::http::Proxy "http://{addr}/";\n'
            f'Acquire::https::Proxy "http://{addr}/";\n')


def source_hosts(texts: dict[str, str]) -> list[tuple[str, int]]:
    """The (host, port) of every http/https URI of the apt sources ``texts`` (file name -> text): one-line
    ``.list`` files (``deb [opts] URI suite …``) and deb822 ``.sources`` files (``URIs:``; ``Enabled: no``
    skipped). ``mirror+``, ``file:``, ``cdrom:`` and other schemes are not the archive's, and are left out."""
    uris: list[str] = []
    for name, text in texts.items():
        if name.endswith(".sources"):
            for stanza in text.split("\n\n"):
                fields: dict[str, str] = {}
                key = ""
                for line in stanza.splitlines():
                    if line.startswith("#") or not line.strip():
                        continue
                    if line[0] in " \t" and key:
                        fields[key] += " " + line.strip()
                        continue
                    key, _, value = line.partition(":")
                    key = key.strip().lower()
                    fields[key] = value.strip()
                if fields.get("enabled", "yes").lower() != "no":
                    uris += fields.get("uris", "").split()
        else:
            for line in text.splitlines():
                words = line.split("#", 1)[0].split()
                if words and words[0] in ("deb", "deb-src"):
                    rest = words[1:]
                    if rest and rest[0].startswith("["):
                        while rest and not rest[0].endswith("]"):
                            rest = rest[1:]
                        rest = rest[1:]
                    uris += rest[:1]
    out: list[tuple[str, int]] = []
    for uri in uris:
        u = urllib.parse.urlsplit(uri)
        if u.scheme in ("http", "https") and u.hostname:
            with contextlib.suppress(ValueError):
                hp = (u.hostname.lower(), u.port or (80 if u.scheme == "http" else 443))
                if hp not in out:
                    out.append(hp)
    return out


def apt_sources(root: Path = SOURCES) -> list[tuple[str, int]]:
    """The archive hosts of this machine's apt sources (``sources.list`` and ``sources.list.d/*.list|*.sources``):
    what the nodes' apt uses too (their /etc is an overlay over this machine's)."""
    texts = {}
    files = [root / "sources.list", *sorted((root / "sources.list.d").glob("*.list")),
             *sorted((root / "sources.list.d").glob("*.sources"))]
    for f in files:
        with contextlib.suppress(OSError):
            texts[f.name] = f.read_text(errors="replace")
    return source_hosts(texts)


def answers(addr: str = APT_PROXY, timeout: float = 3) -> bool:
    """Whether the lab's apt proxy answers ``GET /`` at ``addr`` (200 with ``APT_PROXY_HEADER``)."""
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))    # the lab bridge: no proxy
        with opener.open(f"http://{addr}/", timeout=timeout) as resp:
            return resp.status == 200 and resp.headers.get(APT_PROXY_HEADER) == "1"
    except (urllib.error.URLError, OSError):
        return False


def service(lab_dir: Path, addr: str = APT_PROXY) -> HostService:
    """The proxy of ``lab_dir`` as a :class:`HostService` (its command line names its folder)."""
    paths = proxy_paths(lab_dir)
    return HostService("the lab's apt proxy", addr, paths["pid"], paths["log"], paths["root"],
                       lambda timeout: answers(addr, timeout=timeout))


def proxy_pid(lab_dir: Path) -> int | None:
    """The PID of the proxy this lab dir started, when it still runs (its command line names our dir)."""
    return service(lab_dir).pid()


def start_apt_proxy(lab_dir: Path, log: Log, *, addr: str = APT_PROXY, timeout: float = 15) -> int:
    """Start the proxy (idempotent: one that answers at ``addr`` from this lab dir is kept); its PID."""
    svc = service(lab_dir, addr)
    pid = svc.running()
    if pid:
        return pid
    hosts = apt_sources()
    if not hosts:
        raise LabError("this machine's apt sources name no http or https archive for the lab's apt proxy",
                       observed=f"no URIs in {SOURCES}/sources.list or {SOURCES}/sources.list.d/",
                       expected="e.g. http://deb.debian.org/debian", fix="configure apt on this machine")
    paths = proxy_paths(lab_dir)
    top = str(Path(runbook.__file__).resolve().parents[1])          # this code, whatever the caller's cwd
    argv = [sys.executable, "-m", SERVER_MODULE, "--listen", addr, "--dir", str(paths["root"]),
            *[a for h, p in hosts for a in ("--allow", f"{h}:{p}")]]
    log(f"starting the lab's apt proxy on {addr} (to {', '.join(f'{h}:{p}' for h, p in hosts)})")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([top, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return svc.start(argv, log, timeout=timeout, cwd=top, env=env)


def stop_apt_proxy(lab_dir: Path, timeout: float = 10) -> str:
    """End the proxy this lab dir started (only that process); a note on what was done ('' when none ran)."""
    return service(lab_dir).stop(timeout)


def apt_proxy_status(lab_dir: Path, addr: str = APT_PROXY) -> dict:
    """The proxy's row of ``lab status``: address, PID, whether it answers, the archive hosts, where it keeps .debs."""
    paths = proxy_paths(lab_dir)
    return {**service(lab_dir, addr).status(), "sources": [f"{h}:{p}" for h, p in apt_sources()],
            "cache": str(paths["cache"]), "requests": str(paths["requests"])}

