"""The lab nodes' own package state and their way to the Debian archive: the apt sources the proxy forwards to, the
forward proxy itself (a real one on 127.0.0.1 in front of a real HTTP origin), and the health probe's reading of a
node's overlays and apt line. The lab test (tests/lab/test_node_packages_lab.py) runs them on the nodes."""
from __future__ import annotations

import hashlib
import http.server
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from runbook.lab.netlab import aptproxy, forward_proxy
from runbook.lab.netlab.health import own_packages, packages_cmd
from runbook.lab.netlab.nodes import overlay_upper, prepare_overlays
from runbook.lab.netlab.spec import APT_PROXY, APT_PROXY_CONF, APT_PROXY_HEADER, NODEINIT, OVERLAY_EMPTY, OVERLAYS


def test_the_proxy_forwards_to_the_hosts_of_the_apt_sources_only():
    texts = {
        "sources.list": "# a comment\ndeb [arch=amd64 signed-by=/k.gpg] http://deb.debian.org/debian bookworm main\n"
                        "deb-src http://deb.debian.org/debian bookworm main\n"
                        "deb mirror+http://mirrors.example/list.txt bookworm main\n"
                        "deb file:/srv/repo ./\n",
        "debian.sources": "Types: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\n"
                          "URIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\n\n"
                          "Types: deb\nURIs: https://security.example.org/debian-security\n"
                          "  http://Mirror.Example:8080/debian\nSuites: bookworm-security\n\n"
                          "Types: deb\nEnabled: no\nURIs: http://disabled.example/debian\nSuites: x\n",
        "cuda.list": "deb https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/sbsa/ /\n",
    }
    assert aptproxy.source_hosts(texts) == [("deb.debian.org", 80), ("security.example.org", 443),
                                            ("mirror.example", 8080), ("developer.download.nvidia.com", 443)]


def test_this_machines_sources_are_read_from_list_and_sources_files_only(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text("Types: deb\nURIs: http://deb.debian.org/debian\n"
                                                                "Suites: bookworm\nComponents: main\n")
    (tmp_path / "sources.list.d" / "old.list.disabled-by-farm").write_text("deb https://other.example/apt x main\n")
    assert aptproxy.apt_sources(tmp_path) == [("deb.debian.org", 80)]      # no sources.list: fine
    (tmp_path / "sources.list").write_text("deb http://ftp.example/debian bookworm main\n")
    assert aptproxy.apt_sources(tmp_path) == [("ftp.example", 80), ("deb.debian.org", 80)]


def test_the_nodes_apt_line_names_the_proxy_for_http_and_https():
    text = aptproxy.node_apt_conf()
    assert f'Acquire::http::Proxy "http://{APT_PROXY}/";' in text.splitlines()
    assert f'Acquire::https::Proxy "http://{APT_PROXY}/";' in text.splitlines()


def mounts(lab_dir: Path, name: str, *, fstype: str = "overlay") -> dict[str, str]:
    kv = {f"mount{t}": f"{fstype} rw,relatime,lowerdir={t},upperdir={overlay_upper(lab_dir, name, t)},"
                       f"workdir={overlay_upper(lab_dir, name, t).parent / 'work'}" for t in OVERLAYS}
    kv["aptconf"] = hashlib.sha256(aptproxy.node_apt_conf().encode()).hexdigest()
    return kv


def test_a_node_has_its_own_packages_only_on_its_own_overlays_with_the_proxy_line(tmp_path):
    assert OVERLAYS == ("/usr", "/etc", "/var")        # dpkg's database, conffiles and alternatives, /usr itself
    assert own_packages(mounts(tmp_path, "head"), tmp_path, "head")
    assert not own_packages(mounts(tmp_path, "worker"), tmp_path, "head")          # another node's layer
    assert not own_packages(mounts(tmp_path, "head", fstype="ext4"), tmp_path, "head")
    assert not own_packages({}, tmp_path, "head")                                  # a lab built before the overlays
    for tree in OVERLAYS:
        kv = mounts(tmp_path, "head")
        kv[f"mount{tree}"] = ""                                                    # that tree is the host's
        assert not own_packages(kv, tmp_path, "head"), tree
    kv = mounts(tmp_path, "head")
    kv["aptconf"] = ""                                                             # no proxy line
    assert not own_packages(kv, tmp_path, "head")
    cmd = packages_cmd()
    assert all(f'mount{t}=' in cmd for t in OVERLAYS) and APT_PROXY_CONF in cmd


def test_nodeinit_mounts_the_overlays_before_any_bind_mount():
    """A bind mount made first (the node's /usr/local/sbin, /var/lib/docker, /etc/hosts) would be hidden under the
    overlay mounted after it."""
    text = NODEINIT.read_text()
    assert text.index("mount -t overlay") < text.index("mount --bind")
    assert text.index("mount -t overlay") < text.index('"$NL_APT_CONF_FILE"')     # written into the overlay


# --------------------------------------------------------------------------------------------------
# the forward proxy, for real on 127.0.0.1

class Origin(http.server.SimpleHTTPRequestHandler):
    hits: list[str] = []

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        Origin.hits.append(self.path)
        super().do_GET()


def serve(server) -> threading.Thread:
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    return t


@pytest.fixture
def proxied(tmp_path):
    """An origin serving ``tmp_path/www`` and the proxy in front of it (allowed: only the origin)."""
    www = tmp_path / "www"
    (www / "debian/pool/main/p/perftest").mkdir(parents=True)
    deb = www / "debian/pool/main/p/perftest/perftest_4.5+0.17-1_amd64.deb"
    deb.write_bytes(b"!<arch>\n" + bytes(range(256)) * 300)
    (www / "debian/dists").mkdir()
    (www / "debian/dists/Release").write_text("Origin: Debian\n")
    Origin.hits = []
    origin = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: Origin(*a, directory=str(www)))
    proxy = forward_proxy.Proxy(("127.0.0.1", 0), frozenset({("127.0.0.1", origin.server_port)}), tmp_path / "proxy")
    serve(origin), serve(proxy)
    yield origin, proxy, deb, tmp_path / "proxy"
    for s in (proxy, origin):
        s.shutdown()
        s.server_close()


def logged(root: Path, n: int) -> list[str]:
    """The proxy's request lines once there are ``n`` (it writes a line after the answer's last byte)."""
    deadline = time.monotonic() + 5
    while True:
        lines = (root / "requests.log").read_text().splitlines()
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.02)


def fetch(proxy, url: str, method: str = "GET"):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{proxy.server_port}"}))
    return opener.open(urllib.request.Request(url, method=method), timeout=10)


def test_a_deb_goes_through_once_and_is_then_served_from_the_cache(proxied):
    origin, proxy, deb, root = proxied
    url = f"http://127.0.0.1:{origin.server_port}/debian/pool/main/p/perftest/{deb.name}"
    for _ in range(2):
        with fetch(proxy, url) as resp:
            assert resp.status == 200 and resp.read() == deb.read_bytes()
    assert Origin.hits == [f"/debian/pool/main/p/perftest/{deb.name}"]           # the second from the cache
    kept = forward_proxy.cache_path(root / "cache", "127.0.0.1", origin.server_port, f"/debian/pool/main/p/perftest/{deb.name}")
    assert kept is not None and kept.read_bytes() == deb.read_bytes()
    log = logged(root, 2)
    assert [line.split()[-1] for line in log] == ["archive", "cache"], log
    assert all(f" GET {url} 200 {deb.stat().st_size} " in line for line in log), log


def test_indexes_always_go_to_the_archive_and_head_has_no_body(proxied):
    origin, proxy, _, root = proxied
    url = f"http://127.0.0.1:{origin.server_port}/debian/dists/Release"
    for _ in range(2):
        with fetch(proxy, url) as resp:
            assert resp.read() == b"Origin: Debian\n"
    assert Origin.hits == ["/debian/dists/Release"] * 2
    with fetch(proxy, url, "HEAD") as resp:
        assert resp.status == 200 and resp.headers["Content-Length"] == "15" and resp.read() == b""
    assert not list((root / "cache").rglob("Release"))


def test_a_host_that_is_no_apt_source_is_refused_without_a_connection(proxied):
    origin, proxy, _, root = proxied
    with socket.socket() as s:                   # a port nothing allowed listens on
        s.bind(("127.0.0.1", 0))
        other = s.getsockname()[1]
        with pytest.raises(urllib.error.HTTPError) as err:
            fetch(proxy, f"http://127.0.0.1:{other}/debian/dists/Release")
    assert err.value.code == 403 and b"not an apt source of the lab host" in err.value.read()
    assert Origin.hits == [] and logged(root, 1)[-1].split()[-1] == "refused"


def test_the_proxy_answers_for_itself_with_its_header(proxied):
    _, proxy, _, _ = proxied
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{proxy.server_port}/", timeout=10) as resp:
        assert resp.status == 200 and resp.headers[APT_PROXY_HEADER] == "1"
    assert aptproxy.answers(f"127.0.0.1:{proxy.server_port}")
    assert not aptproxy.answers(f"127.0.0.1:{_free_port()}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect(proxy, target: str) -> tuple[socket.socket, bytes]:
    s = socket.create_connection(("127.0.0.1", proxy.server_port), timeout=10)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    return s, head


def test_connect_tunnels_to_an_allowed_host_only(proxied):
    origin, proxy, _, root = proxied
    s, head = connect(proxy, f"127.0.0.1:{origin.server_port}")
    with s:
        assert head.startswith(b"HTTP/1.1 200"), head
        s.sendall(b"GET /debian/dists/Release HTTP/1.0\r\nHost: x\r\n\r\n")
        got = b""
        while chunk := s.recv(4096):
            got += chunk
    assert got.startswith(b"HTTP/1.0 200") and got.endswith(b"Origin: Debian\n"), got
    s, head = connect(proxy, f"127.0.0.1:{_free_port()}")
    with s:
        assert head.startswith(b"HTTP/1.1 403"), head
    assert [line.split()[-1] for line in logged(root, 2)] == ["tunnel", "refused"]


@pytest.mark.parametrize("path", ["/debian/dists/Release", "/a/../../etc/x.deb", "/", "/pool/./x.deb"])
def test_only_plain_deb_paths_are_kept(tmp_path, path):
    assert forward_proxy.cache_path(tmp_path, "h", 80, path) is None


def test_allow_values_need_a_host_and_a_port():
    assert forward_proxy.parse_allow(["Deb.Debian.org:80"]) == {("deb.debian.org", 80)}
    for bad in ("deb.debian.org", ":80", "h:0", "h:x"):
        with pytest.raises(SystemExit):
            forward_proxy.parse_allow([bad])


@pytest.mark.skipif(os.geteuid() != 0, reason="owners and trusted.* xattrs need root")
def test_a_node_starts_with_an_empty_apt_archive_cache_and_keeps_its_own_later(tmp_path):
    """This machine's /var/cache/apt/archives holds the .debs of its installs (every lab package): seen through, a
    node would "install" perftest without a download. Opaque in the node's /var layer, it is empty there."""
    host = Path(OVERLAY_EMPTY[0])
    if not (host / "partial").is_dir():
        pytest.skip(f"{host}/partial is not on this machine")
    prepare_overlays(tmp_path, "head")
    upper = overlay_upper(tmp_path, "head", "/var")
    mine = upper / host.relative_to("/var")
    assert os.getxattr(mine, "trusted.overlay.opaque") == b"y"
    for sub in ("", "partial"):
        want, got = (host / sub).stat(), (mine / sub).stat()
        assert (got.st_uid, got.st_gid, got.st_mode) == (want.st_uid, want.st_gid, want.st_mode), sub
    assert sorted(p.name for p in mine.iterdir()) == ["partial"]
    assert all((overlay_upper(tmp_path, "head", t).parent / "work").is_dir() for t in OVERLAYS)
    (mine / "perftest_1_amd64.deb").write_bytes(b"x")        # what the node fetched: kept by a restart
    prepare_overlays(tmp_path, "head")
    assert (mine / "perftest_1_amd64.deb").exists()
