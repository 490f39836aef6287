"""The lab registry's image: a two-platform OCI index built from the lab's busybox rootfs (pure, deterministic),
and its push over the registry's HTTP API (standard library ``urllib``, a timeout on every request).

    ref = parse_reference("ghcr.io/anemll/dspark-vllm-gx10:0.1.1@sha256:a839…")   # host, path, tag, digest
    index = lab_index(rootfs_tar, native="linux/amd64")      # the node's platform + linux/arm64 (config-only)
    result = push("10.77.0.1:5077", ref.path, ref.tag, index)   # result.digest == index.digest

The index holds the node's real platform (the busybox rootfs plus a marker file, so its layer differs from the
lab's pre-imported ``spark-runbook/lab-runtime:1`` and a pull transfers it for real) and one other platform (a
tiny layer with no binaries): a node's ``docker pull`` must pick its own platform, and a ``docker save`` of
the whole index would name blobs the node never fetched. Every byte is derived from the rootfs, so the digest
a rehearsal pins is known before the push and equals what the registry answers.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import platform as _platform
import re
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from ..errors import LabError

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MARKER_FILE = "etc/spark-runbook-image"
#: docker's architecture names for ``uname -m``
ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
_HOST = re.compile(r"^(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+|[A-Za-z0-9.-]+:\d+)$")


# --------------------------------------------------------------------------------------------------
# references

@dataclass(frozen=True)
class Reference:
    """A docker image reference split as docker reads it: ``[host/]path[:tag][@digest]``."""
    host: str          # "" when the reference names none (docker's default registry)
    path: str
    tag: str = ""
    digest: str = ""   # sha256:<64 hex> or ""

    def __str__(self) -> str:
        return ((f"{self.host}/" if self.host else "") + self.path + (f":{self.tag}" if self.tag else "")
                + (f"@{self.digest}" if self.digest else ""))

    def replace(self, *, host: str | None = None, digest: str | None = None) -> "Reference":
        return Reference(self.host if host is None else host, self.path, self.tag,
                         self.digest if digest is None else digest)


def parse_reference(image: str) -> Reference:
    """Split an image reference (the first component is a registry host when it has a dot or a port, or is
    ``localhost``, as docker decides)::

        ghcr.io/anemll/dspark-vllm-gx10:0.1.1@sha256:a839…  ->  ghcr.io, anemll/dspark-vllm-gx10, 0.1.1, sha256:a839…
    """
    rest, _, digest = image.partition("@")
    if digest and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise ValueError(f"{image!r}: the digest is not sha256:<64 hex>")
    host, sep, path = rest.partition("/")
    if not sep or not _HOST.match(host):
        host, path = "", rest
    name, _, tag = path.rpartition(":") if ":" in path.rsplit("/", 1)[-1] else (path, "", "")
    if not name:
        raise ValueError(f"{image!r}: no repository path")
    return Reference(host, name, tag, digest)


# --------------------------------------------------------------------------------------------------
# the image (pure)

def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def native_platform(machine: str | None = None) -> str:
    """``linux/<docker arch>`` of this machine (the lab nodes share its kernel and binaries)."""
    m = machine or _platform.machine()
    if m not in ARCH:
        raise LabError("the lab's registry image knows no docker architecture for this machine",
                       observed=f"uname -m: {m}", expected=", ".join(sorted(ARCH)), fix="run the lab on x86_64 or aarch64")
    return f"linux/{ARCH[m]}"


def other_platform(native: str) -> str:
    """The second platform of the index: arm64 beside amd64, amd64 beside anything else."""
    return "linux/arm64" if native == "linux/amd64" else "linux/amd64"


@dataclass(frozen=True)
class PlatformImage:
    platform: str                 # os/arch
    config: bytes
    layers: tuple[bytes, ...]     # gzip'd tars
    manifest: bytes

    @property
    def digest(self) -> str:
        return sha256(self.manifest)


@dataclass(frozen=True)
class IndexImage:
    images: tuple[PlatformImage, ...]
    index: bytes

    @property
    def digest(self) -> str:
        return sha256(self.index)

    @property
    def platforms(self) -> list[str]:
        return [i.platform for i in self.images]

    def blobs(self) -> dict[str, bytes]:
        """digest -> bytes of every config and layer (what is uploaded before the manifests)."""
        out: dict[str, bytes] = {}
        for img in self.images:
            for data in (img.config, *img.layers):
                out[sha256(data)] = data
        return out

    def image_of(self, platform: str) -> PlatformImage:
        for img in self.images:
            if img.platform == platform:
                return img
        raise KeyError(platform)


def add_files(rootfs_tar: bytes, files: dict[str, bytes]) -> bytes:
    """``rootfs_tar`` (b"": none) with ``files`` appended (regular, 0644, root, mtime 0: deterministic)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as out:
        if rootfs_tar:
            with tarfile.open(fileobj=io.BytesIO(rootfs_tar)) as src:
                for member in src.getmembers():
                    out.addfile(member, src.extractfile(member) if member.isreg() else None)
        for name, data in sorted(files.items()):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime, ti.uid, ti.gid = len(data), 0o644, 0, 0, 0
            out.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def platform_image(platform: str, layer_tars: list[bytes], *, cmd: tuple[str, ...] = ("/bin/sh",)) -> PlatformImage:
    """One platform's OCI image from uncompressed layer tars (gzip without a timestamp: same bytes, same digest)."""
    os_name, arch = platform.split("/")[:2]
    layers = tuple(gzip.compress(t, compresslevel=6, mtime=0) for t in layer_tars)
    config = _canonical({"architecture": arch, "os": os_name, "created": "1970-01-01T00:00:00Z",
                         "config": {"Cmd": list(cmd)},
                         "rootfs": {"type": "layers", "diff_ids": [sha256(t) for t in layer_tars]},
                         "history": [{"created": "1970-01-01T00:00:00Z",
                                      "created_by": "spark-runbook lab registry image"}]})
    manifest = _canonical({"schemaVersion": 2, "mediaType": MEDIA_MANIFEST,
                           "config": {"mediaType": MEDIA_CONFIG, "digest": sha256(config), "size": len(config)},
                           "layers": [{"mediaType": MEDIA_LAYER, "digest": sha256(l), "size": len(l)}
                                      for l in layers]})
    return PlatformImage(platform, config, layers, manifest)


def index_image(images: list[PlatformImage]) -> IndexImage:
    """An OCI image index over ``images`` (one entry per platform, in the order given)."""
    if len({i.platform for i in images}) != len(images) or not images:
        raise ValueError(f"an index needs distinct platforms, got {[i.platform for i in images]}")
    entries = []
    for img in images:
        os_name, arch = img.platform.split("/")[:2]
        entries.append({"mediaType": MEDIA_MANIFEST, "digest": img.digest, "size": len(img.manifest),
                        "platform": {"architecture": arch, "os": os_name}})
    return IndexImage(tuple(images), _canonical({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": entries}))


def lab_index(rootfs_tar: bytes, native: str) -> IndexImage:
    """The lab's two-platform image: ``native`` runs the lab's busybox rootfs (plus a marker file), the other
    platform is a one-file layer with no binaries (it exists so that the index is multi-arch)."""
    other = other_platform(native)
    real = platform_image(native, [add_files(rootfs_tar, {MARKER_FILE: f"{native}: lab registry image\n".encode()})])
    stub = platform_image(other, [add_files(b"", {MARKER_FILE: f"{other}: stand-in, no binaries\n".encode()})])
    return index_image([real, stub])


# --------------------------------------------------------------------------------------------------
# the push (registry HTTP API v2)

@dataclass
class PushResult:
    reference: str
    digest: str                 # what the registry answered for the index (Docker-Content-Digest)
    seconds: float
    bytes_sent: int
    blobs_sent: int
    blobs_present: int
    platforms: list[str] = field(default_factory=list)


def upload_url(base: str, location: str, digest: str) -> str:
    """The PUT that completes a monolithic upload: the registry's ``Location`` (absolute or relative, with or
    without a query) plus ``digest=``."""
    url = urllib.parse.urljoin(base, location)
    return url + ("&" if "?" in url else "?") + urllib.parse.urlencode({"digest": digest})


#: the lab registry is on this machine's lab bridge: never through a proxy the environment names
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _request(method: str, url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None,
             timeout: float) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with DIRECT.open(req, timeout=timeout) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        raise LabError("the lab registry does not answer", observed=f"{method} {url}: {exc}",
                       expected="the registry's HTTP API", fix="python -m runbook lab up (it starts the registry); "
                       "see .lab/registry/registry.log") from None


def _expect(status: int, want: tuple[int, ...], what: str, body: bytes) -> None:
    if status not in want:
        raise LabError(f"the lab registry refused {what}", observed=f"HTTP {status}: {body[:300]!r}",
                       expected=f"HTTP {'/'.join(map(str, want))}", fix="see .lab/registry/registry.log")


def push(registry: str, repository: str, tag: str, index: IndexImage, *, timeout: float = 30) -> PushResult:
    """Push ``index`` (blobs, each platform's manifest by digest, then the index under ``tag``, or under its
    digest when ``tag`` is empty) to ``http://<registry>``. Blobs the registry has are not sent again."""
    t0 = time.monotonic()
    base = f"http://{registry}/v2/{repository}/"
    sent = present = 0
    nbytes = 0
    for digest, data in index.blobs().items():
        status, _, body = _request("HEAD", f"{base}blobs/{digest}", timeout=timeout)
        if status == 200:
            present += 1
            continue
        status, headers, body = _request("POST", f"{base}blobs/uploads/", data=b"", timeout=timeout)
        _expect(status, (202,), f"an upload of {repository}", body)
        if "location" not in headers:
            raise LabError("the lab registry's upload answer has no Location", observed=str(headers)[:300])
        status, _, body = _request("PUT", upload_url(base, headers["location"], digest), data=data, timeout=timeout,
                                   headers={"Content-Type": "application/octet-stream"})
        _expect(status, (201,), f"blob {digest[:19]}", body)
        sent += 1
        nbytes += len(data)
    for img in index.images:
        status, _, body = _request("PUT", f"{base}manifests/{img.digest}", data=img.manifest, timeout=timeout,
                                   headers={"Content-Type": MEDIA_MANIFEST})
        _expect(status, (201,), f"the {img.platform} manifest", body)
    status, headers, body = _request("PUT", f"{base}manifests/{tag or index.digest}", data=index.index,
                                     timeout=timeout, headers={"Content-Type": MEDIA_INDEX})
    _expect(status, (201,), "the index", body)
    answered = headers.get("docker-content-digest", "")
    if answered != index.digest:
        raise LabError("the lab registry stored the index under another digest", observed=answered,
                       expected=index.digest, fix="see .lab/registry/registry.log")
    ref = f"{registry}/{repository}" + (f":{tag}" if tag else "") + f"@{answered}"
    return PushResult(ref, answered, round(time.monotonic() - t0, 3), nbytes, sent, present, index.platforms)


def manifest_platforms(registry: str, repository: str, reference: str, *, timeout: float = 10) -> list[str]:
    """The platforms the registry's manifest for ``reference`` (tag or digest) lists ([] for a single image)."""
    status, _, body = _request("GET", f"http://{registry}/v2/{repository}/manifests/{reference}", timeout=timeout,
                               headers={"Accept": f"{MEDIA_INDEX}, {MEDIA_MANIFEST}"})
    _expect(status, (200,), f"the manifest {reference}", body)
    doc = json.loads(body)
    return [f"{m['platform']['os']}/{m['platform']['architecture']}" for m in doc.get("manifests", [])]
