"""Where the head's API is, and how this machine reaches it: directly, or through an SSH forward.

``API_HOST`` is the address vLLM binds on the head (``--host``). ``127.0.0.1`` (the default) and the head's
fabric/bootstrap addresses are not reachable from the machine the runbook runs on, so every client of the
runbook (readiness, smoke, vision/tools, the bench, the watchdog, ``status``) talks to it through one SSH
local forward per process, opened on first use and kept while the process lives. Any other bind address
(``0.0.0.0``, a management IP) is reached directly and serves other machines too, so it needs an API key.

    api_address(profile)   # "http://127.0.0.1:8888 on spark1": what the head serves (for evidence)
    base_url(profile)      # "http://127.0.0.1:41877": where this process sends its requests
"""
from __future__ import annotations

import atexit
import threading

from ..remote import LocalForward, ssh_host_config, ssh_settings

__all__ = ["api_address", "api_host", "base_url", "close_forwards", "key_required", "tunnelled"]

LOOPBACK = "127.0.0.1"
EVERY_ADDRESS = "0.0.0.0"

_forwards: dict[tuple, LocalForward] = {}
_lock = threading.Lock()


def api_host(profile) -> str:
    """The host this machine reaches the head on: HEAD_SSH's HostName (from SSH_CONFIG) or its host part."""
    config = profile.resolve_path(profile.ssh_config) if profile.ssh_config else None
    return ssh_host_config(profile.head_ssh, config)["hostname"]


def tunnelled(profile) -> bool:
    """True when only the head (or the fabric) can reach the bind address: loopback, or a node's fabric or
    bootstrap address (the runbook's machine is not on the fabric)."""
    fabric = {ip for spec in profile.nodes for ip in (spec.fabric_ip, spec.bootstrap_ip) if ip}
    return profile.api_host == LOOPBACK or profile.api_host in fabric


def key_required(profile) -> bool:
    """An API bound beyond the head's loopback is reachable by other machines: it must need a key."""
    return profile.api_host != LOOPBACK


def api_address(profile) -> str:
    """What the head serves, as one line for evidence and the report (never a local forward's port)."""
    if profile.api_host == EVERY_ADDRESS:
        return f"http://{api_host(profile)}:{profile.port} (bound to {EVERY_ADDRESS})"
    url = f"http://{profile.api_host}:{profile.port}"
    return f"{url} on {profile.head_ssh} (through an SSH forward)" if tunnelled(profile) else url


def base_url(profile) -> str:
    """Where this process sends API requests; opens (or re-opens) the SSH forward when one is needed."""
    if not tunnelled(profile):
        host = api_host(profile) if profile.api_host == EVERY_ADDRESS else profile.api_host
        return f"http://{host}:{profile.port}"
    settings = ssh_settings(profile)
    key = (profile.head_ssh, profile.api_host, int(profile.port), settings.ssh_config, settings.key_file,
           settings.known_hosts)
    with _lock:
        forward = _forwards.get(key)
        if forward is None or not forward.alive():
            if forward is not None:
                forward.close()
            forward = LocalForward(profile.head_ssh, settings, profile.api_host, profile.port).open()
            _forwards[key] = forward
    return f"http://{forward.url_host}"


def close_forwards() -> None:
    """Close every forward this process opened (also at exit; a killed process's forwards end on their own)."""
    with _lock:
        for forward in _forwards.values():
            forward.close()
        _forwards.clear()


atexit.register(close_forwards)
