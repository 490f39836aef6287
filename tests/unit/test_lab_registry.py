"""The lab registry (issue 23 item 1): the two-platform image a rehearsal pushes (pure, deterministic), its push
over the registry HTTP API (against a stdlib stand-in that refuses what it does not know), the registry's config,
the nodes' insecure-registry flag, the rehearsal's IMAGE substitutions (registry host, digest) and the image plan
of a rehearsal (a real pull)."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from runbook.errors import LabError
from runbook.facts import docker_pull
from runbook.facts.system import ImageInfo, plan_image
from runbook.lab import oci
from runbook.lab.netlab import dockerd, registry
from runbook.lab.netlab.spec import REGISTRY
from runbook.lab.rehearsal import (DIGEST_WHY, HARDWARE, LAB_CLASS, image_substitutions, load_rehearsal,
                                   rehearsal_overrides, substitutions)
from runbook.profile import load_profile

ENV = Path(__file__).resolve().parents[2] / "env"
DIGEST_B = "sha256:a83948492cf13df455170fb42885f5ef4db54fefe0feff0f841ecbff464ac9d8"


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


ROOTFS = _tar({"bin/busybox": b"\x7fELF not really busybox", "etc/passwd": b"root:x:0:0::/root:/bin/sh\n"})


# ------------------------------------------------------------------------------------------- references

@pytest.mark.parametrize("image,host,path,tag,digest", [
    (f"ghcr.io/anemll/dspark-vllm-gx10:0.1.1@{DIGEST_B}", "ghcr.io", "anemll/dspark-vllm-gx10", "0.1.1", DIGEST_B),
    ("ghcr.io/miaai-lab/deepseek-v4.1-flash-exl3-2x-dgx-sparks:2.9bpw", "ghcr.io",
     "miaai-lab/deepseek-v4.1-flash-exl3-2x-dgx-sparks", "2.9bpw", ""),
    ("10.77.0.1:5077/a/b:1", "10.77.0.1:5077", "a/b", "1", ""),
    ("localhost/x", "localhost", "x", "", ""),
    ("spark-runbook/lab-runtime:1", "", "spark-runbook/lab-runtime", "1", ""),   # no dot, no port: a path
    ("busybox", "", "busybox", "", ""),
    (f"nvcr.io/nvidia/vllm@{DIGEST_B}", "nvcr.io", "nvidia/vllm", "", DIGEST_B),
])
def test_references_split_as_docker_reads_them(image, host, path, tag, digest):
    ref = oci.parse_reference(image)
    assert (ref.host, ref.path, ref.tag, ref.digest) == (host, path, tag, digest)
    assert str(ref) == image
    moved = ref.replace(host=REGISTRY)
    assert str(moved).startswith(REGISTRY + "/" + path) and moved.tag == tag and moved.digest == digest


def test_a_reference_with_a_bad_digest_is_refused():
    with pytest.raises(ValueError, match="sha256"):
        oci.parse_reference("ghcr.io/a/b:1@sha256:abc")


# ------------------------------------------------------------------------------------------- the image

def test_platforms_of_this_machine_and_the_other_one():
    assert oci.native_platform("x86_64") == "linux/amd64" and oci.native_platform("aarch64") == "linux/arm64"
    assert oci.other_platform("linux/amd64") == "linux/arm64" and oci.other_platform("linux/arm64") == "linux/amd64"
    with pytest.raises(LabError) as err:
        oci.native_platform("riscv64")
    assert "riscv64" in err.value.observed


def test_add_files_keeps_the_rootfs_and_appends_deterministically():
    out = oci.add_files(ROOTFS, {oci.MARKER_FILE: b"hello\n"})
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        names = tar.getnames()
        assert tar.extractfile(oci.MARKER_FILE).read() == b"hello\n"
        assert tar.extractfile("bin/busybox").read() == b"\x7fELF not really busybox"
    assert names == ["bin/busybox", "etc/passwd", oci.MARKER_FILE]
    assert oci.add_files(ROOTFS, {oci.MARKER_FILE: b"hello\n"}) == out
    with tarfile.open(fileobj=io.BytesIO(oci.add_files(b"", {"etc/x": b"1"}))) as tar:
        assert tar.getnames() == ["etc/x"]


def test_the_lab_index_holds_two_platforms_with_consistent_digests():
    index = oci.lab_index(ROOTFS, "linux/amd64")
    assert index.platforms == ["linux/amd64", "linux/arm64"]
    doc = json.loads(index.index)
    assert doc["mediaType"] == oci.MEDIA_INDEX and len(doc["manifests"]) == 2
    blobs = index.blobs()
    assert len(blobs) == 4                                  # two configs, two layers
    for entry, img in zip(doc["manifests"], index.images):
        assert entry["digest"] == img.digest == "sha256:" + hashlib.sha256(img.manifest).hexdigest()
        assert entry["platform"] == dict(zip(("os", "architecture"), img.platform.split("/")))
        manifest = json.loads(img.manifest)
        config = json.loads(blobs[manifest["config"]["digest"]])
        assert (config["os"], config["architecture"]) == tuple(img.platform.split("/"))
        assert [l["digest"] for l in manifest["layers"]] == [oci.sha256(l) for l in img.layers]
        # the diff id is the uncompressed layer's digest, as docker checks it after the pull
        assert config["rootfs"]["diff_ids"] == [oci.sha256(gzip.decompress(l)) for l in img.layers]
    real = index.image_of("linux/amd64")
    # the marker makes the pulled layer differ from the lab's pre-imported image (plain rootfs): a pull moves bytes
    assert json.loads(real.config)["rootfs"]["diff_ids"] != [oci.sha256(ROOTFS)]
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(index.image_of("linux/arm64").layers[0]))) as tar:
        assert tar.getnames() == [oci.MARKER_FILE]          # the other platform carries no binaries
    assert oci.lab_index(ROOTFS, "linux/amd64").digest == index.digest          # same bytes, same digest
    assert oci.lab_index(ROOTFS, "linux/arm64").digest != index.digest


def test_an_index_needs_distinct_platforms():
    img = oci.platform_image("linux/amd64", [ROOTFS])
    with pytest.raises(ValueError):
        oci.index_image([img, img])
    with pytest.raises(ValueError):
        oci.index_image([])


@pytest.mark.parametrize("location,want", [
    ("/v2/a/b/blobs/uploads/u1?_state=s", "http://r:1/v2/a/b/blobs/uploads/u1?_state=s&digest=sha256%3Aab"),
    ("http://r:1/v2/a/b/blobs/uploads/u2", "http://r:1/v2/a/b/blobs/uploads/u2?digest=sha256%3Aab"),
])
def test_the_upload_url_completes_the_registrys_location(location, want):
    assert oci.upload_url("http://r:1/v2/a/b/", location, "sha256:ab") == want


# ------------------------------------------------------------------------------------------- the push

class FakeRegistry(BaseHTTPRequestHandler):
    """The handful of registry v2 routes a push uses; anything else is answered 405 and recorded."""
    blobs: dict[str, bytes]
    manifests: dict[str, tuple[str, bytes]]
    refused: list[str]
    wrong_digest = False

    def log_message(self, *_a):
        pass

    def _send(self, code: int, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_HEAD(self):
        m = re.fullmatch(r"/v2/([a-z0-9/._-]+)/blobs/(sha256:[0-9a-f]{64})", self.path)
        if not m:
            self.refused.append(f"HEAD {self.path}")
            return self._send(405)
        self._send(200 if m.group(2) in self.blobs else 404)

    def do_POST(self):
        m = re.fullmatch(r"/v2/([a-z0-9/._-]+)/blobs/uploads/", self.path)
        self._body()
        if not m:
            self.refused.append(f"POST {self.path}")
            return self._send(405)
        self._send(202, {"Location": f"/v2/{m.group(1)}/blobs/uploads/u{len(self.blobs)}?_state=x"})

    def do_PUT(self):
        body = self._body()
        m = re.fullmatch(r"/v2/([a-z0-9/._-]+)/blobs/uploads/u\d+\?_state=x&digest=(sha256%3A[0-9a-f]{64})", self.path)
        if m:
            digest = m.group(2).replace("%3A", ":")
            if oci.sha256(body) != digest:
                return self._send(400, body=b'{"errors":[{"code":"DIGEST_INVALID"}]}')
            self.blobs[digest] = body
            return self._send(201)
        m = re.fullmatch(r"/v2/([a-z0-9/._-]+)/manifests/([\w.:-]+)", self.path)
        if m:
            doc = json.loads(body)
            for ref in [doc.get("config")] + doc.get("layers", []):
                if ref and ref["digest"] not in self.blobs:
                    return self._send(400, body=b'{"errors":[{"code":"MANIFEST_BLOB_UNKNOWN"}]}')
            for ref in doc.get("manifests", []):
                if ref["digest"] not in self.manifests:
                    return self._send(400, body=b'{"errors":[{"code":"MANIFEST_BLOB_UNKNOWN"}]}')
            digest = oci.sha256(body) if not self.wrong_digest else "sha256:" + "0" * 64
            self.manifests[m.group(2)] = self.manifests[digest] = (self.headers["Content-Type"], body)
            return self._send(201, {"Docker-Content-Digest": digest})
        self.refused.append(f"PUT {self.path}")
        self._send(405)

    def do_GET(self):
        m = re.fullmatch(r"/v2/([a-z0-9/._-]+)/manifests/([\w.:-]+)", self.path)
        if not m or m.group(2) not in self.manifests:
            self.refused.append(f"GET {self.path}")
            return self._send(404)
        media, body = self.manifests[m.group(2)]
        self._send(200, {"Content-Type": media}, body)


@pytest.fixture
def fake_registry():
    handler = type("Handler", (FakeRegistry,), {"blobs": {}, "manifests": {}, "refused": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_push_uploads_blobs_manifests_and_the_index_once(fake_registry):
    addr, handler = fake_registry
    index = oci.lab_index(ROOTFS, "linux/amd64")
    first = oci.push(addr, "anemll/dspark-vllm-gx10", "0.1.1", index, timeout=10)
    assert first.digest == index.digest and first.blobs_sent == 4 and first.blobs_present == 0
    assert first.bytes_sent == sum(len(b) for b in index.blobs().values())
    assert first.reference == f"{addr}/anemll/dspark-vllm-gx10:0.1.1@{index.digest}"
    assert handler.manifests["0.1.1"] == (oci.MEDIA_INDEX, index.index)
    assert set(handler.blobs) == set(index.blobs())
    again = oci.push(addr, "anemll/dspark-vllm-gx10", "0.1.1", index, timeout=10)
    assert (again.blobs_sent, again.blobs_present, again.digest) == (0, 4, index.digest)
    assert oci.manifest_platforms(addr, "anemll/dspark-vllm-gx10", "0.1.1") == ["linux/amd64", "linux/arm64"]
    assert handler.refused == []


def test_push_without_a_tag_stores_the_index_under_its_digest(fake_registry):
    addr, handler = fake_registry
    index = oci.lab_index(ROOTFS, "linux/arm64")
    out = oci.push(addr, "a/b", "", index, timeout=10)
    assert out.reference == f"{addr}/a/b@{index.digest}" and index.digest in handler.manifests


def test_push_refuses_a_registry_that_stores_another_digest(fake_registry):
    addr, handler = fake_registry
    handler.wrong_digest = True
    with pytest.raises(LabError) as err:
        oci.push(addr, "a/b", "1", oci.lab_index(ROOTFS, "linux/amd64"), timeout=10)
    assert "another digest" in err.value.what


def test_push_to_a_registry_that_is_down_names_the_fix():
    with pytest.raises(LabError) as err:
        oci.push("127.0.0.1:9", "a/b", "1", oci.lab_index(ROOTFS, "linux/amd64"), timeout=5)
    assert "does not answer" in err.value.what and "lab up" in err.value.fix


# ------------------------------------------------------------------------------------------- the registry process

def test_registry_config_serves_the_lab_address_from_the_lab_dir(tmp_path):
    yaml = pytest.importorskip("yaml")
    cfg = yaml.safe_load(registry.config_text(tmp_path / "data", REGISTRY))
    assert cfg["http"]["addr"] == REGISTRY == "10.77.0.1:5077"
    assert cfg["storage"]["filesystem"]["rootdirectory"] == str(tmp_path / "data")
    assert cfg["storage"]["delete"]["enabled"] is True and "tls" not in cfg["http"]
    assert registry.registry_paths(tmp_path)["config"] == tmp_path / "registry" / "config.yml"


def test_a_registry_that_never_started_is_not_healthy_and_stopping_it_does_nothing(tmp_path):
    st = registry.registry_status(tmp_path, "127.0.0.1:9")
    assert st["pid"] is None and not st["healthy"] and st["address"] == "127.0.0.1:9"
    assert registry.stop_registry(tmp_path) == ""
    assert registry.answers("127.0.0.1:9", timeout=1) is False


def test_dockerd_is_started_trusting_the_lab_registry_and_the_probe_reads_it():
    from runbook.lab.netlab.spec import node_specs
    script = dockerd.dockerd_script(node_specs(2)[0])
    assert f"--insecure-registry {REGISTRY}" in script
    info = json.dumps({REGISTRY: {"Name": REGISTRY, "Mirrors": [], "Secure": False, "Official": False},
                       "docker.io": {"Name": "docker.io", "Mirrors": [], "Secure": True, "Official": True}})
    assert dockerd.insecure_registry_known(info)
    assert not dockerd.insecure_registry_known(json.dumps({"docker.io": {"Secure": True}}))   # an old lab's dockerd
    assert not dockerd.insecure_registry_known(json.dumps({REGISTRY: {"Secure": True}}))
    assert not dockerd.insecure_registry_known("") and not dockerd.insecure_registry_known("not json")


# ------------------------------------------------------------------------------------------- the rehearsal's IMAGE

def test_recipe_a_keeps_its_path_and_tag_only_the_registry_host_moves():
    subs = image_substitutions(load_profile(ENV / "exl3-v41.env"))
    assert len(subs) == 1
    (host,) = subs
    assert (host.key, host.part, host.recipe, host.lab) == ("IMAGE", "registry host", "ghcr.io", REGISTRY)
    assert host.override == f"{REGISTRY}/miaai-lab/deepseek-v4.1-flash-exl3-2x-dgx-sparks:2.9bpw"
    assert host.kind == LAB_CLASS


def test_recipe_b_keeps_path_and_tag_and_the_digest_is_the_lab_images_with_its_reason():
    profile = load_profile(ENV / "dspark-v4.env")
    lab_digest = "sha256:" + "1" * 64
    subs = image_substitutions(profile, lab_digest)
    assert [s.part for s in subs] == ["registry host", "digest"]
    digest = subs[1]
    assert (digest.recipe, digest.lab, digest.why) == (DIGEST_B, lab_digest, DIGEST_WHY)
    assert rehearsal_overrides(subs)["IMAGE"] == f"{REGISTRY}/anemll/dspark-vllm-gx10:0.1.1@{lab_digest}"
    # without the lab image's digest (offline), the recipe's digest is kept as it is
    assert rehearsal_overrides(image_substitutions(profile))["IMAGE"] == f"{REGISTRY}/anemll/dspark-vllm-gx10:0.1.1@{DIGEST_B}"
    assert image_substitutions(load_profile(ENV / "lab.env")) == []            # a process runtime uses no image


@pytest.mark.parametrize("path", ["env/exl3-v41.env", "env/dspark-v4.env", "env/tp3-dspark.env"])
def test_the_registries_group_holds_only_the_hub_and_the_registry_host(path):
    subs = substitutions(load_profile(ENV.parent / path))
    registries = [(s.key, s.part) for s in subs if s.group == "registries"]
    assert sorted(registries) == [("HF_ENDPOINT", ""), ("IMAGE", "registry host")]
    vllm_bin = [s for s in subs if s.key == "VLLM_BIN"]
    assert len(vllm_bin) == 1 and vllm_bin[0].kind == HARDWARE and "CPU build" in vllm_bin[0].why
    rehearsed, overrides, _ = load_rehearsal(ENV.parent / path)
    assert rehearsed.image == overrides["IMAGE"] and rehearsed.image.startswith(REGISTRY + "/")
    assert oci.parse_reference(rehearsed.image).path == oci.parse_reference(load_profile(ENV.parent / path).image).path


# ------------------------------------------------------------------------------------------- the image plan

def test_a_rehearsal_pulls_where_the_lab_profile_never_does():
    a = ImageInfo("sha256:" + "a" * 64, ["sha256:l1"])
    b_rehearsed, _, _ = load_rehearsal(ENV / "dspark-v4.env")
    plan = plan_image(b_rehearsed, {"head": None, "worker": None})
    assert (plan.action, plan.targets) == ("pull", ["head", "worker"])
    plan = plan_image(b_rehearsed, {"head": a, "worker": None})                 # pinned: the worker pulls too
    assert (plan.action, plan.targets) == ("pull", ["worker"])
    a_rehearsed, _, _ = load_rehearsal(ENV / "exl3-v41.env")
    plan = plan_image(a_rehearsed, {"head": None, "worker": None})
    assert (plan.action, plan.targets) == ("pull-head", ["head", "worker"])
    lab = load_profile(ENV / "lab.env", {"RUNTIME": "docker"})
    assert plan_image(lab, {"head": None, "worker": a}).action == "fail"


# ------------------------------------------------------------------------------------------- a failed pull

def test_a_refused_connection_to_the_registry_is_its_own_kind():
    text = ('Error response from daemon: Get "http://10.77.0.1:5077/v2/": dial tcp 10.77.0.1:5077: '
            "connect: connection refused")
    err = docker_pull.classify_pull(text)
    assert err is not None and (err.kind, err.action) == ("unreachable", "fix-registry")
    # a rank's own refused connection (PyTorch's store, NCCL's socket) is not a pull
    assert docker_pull.classify_pull("The client socket has failed to connect to [spark-head]:29501 "
                                     "(errno: 111 - Connection refused)") is None


def test_publish_pins_the_lab_images_digest_only_where_the_recipe_pins_one(monkeypatch):
    from runbook.lab import control, rehearsal
    index = oci.lab_index(ROOTFS, "linux/amd64")
    monkeypatch.setattr(control, "lab_image", lambda **_k: index)
    (row,) = rehearsal.publish_image(load_profile(ENV / "dspark-v4.env"))
    assert (row.part, row.recipe, row.lab) == ("digest", DIGEST_B, index.digest)
    assert row.override == f"{REGISTRY}/anemll/dspark-vllm-gx10:0.1.1@{index.digest}"
    assert rehearsal.publish_image(load_profile(ENV / "exl3-v41.env")) == []      # a moving tag: nothing to pin


def test_the_rehearsal_image_is_refused_before_any_push_when_it_is_not_the_lab_registrys(monkeypatch):
    from runbook.lab import control
    index = oci.lab_index(ROOTFS, "linux/amd64")
    monkeypatch.setattr(control, "lab_image", lambda **_k: index)
    monkeypatch.setattr(oci, "push", lambda *a, **k: pytest.fail("pushed"))
    with pytest.raises(LabError) as err:                                    # the recipe's own registry
        control.ensure_rehearsal_image(load_profile(ENV / "dspark-v4.env"), info=None)
    assert "lab registry" in err.value.what and "load_rehearsal" in err.value.fix
    rehearsed, _, _ = load_rehearsal(ENV / "dspark-v4.env")                 # not published: the recipe's digest
    with pytest.raises(LabError) as err:
        control.ensure_rehearsal_image(rehearsed, info=None)
    assert err.value.observed == DIGEST_B and err.value.expected == index.digest


def test_a_layer_that_fails_to_register_is_a_full_disk_never_a_retry():
    """Issue 36: disk full while extracting a layer was named a dropped connection with the fix "retry"."""
    text = ("a1b2c3d4e5f6: Extracting [=====>        ]  1.2GB/9.8GB\n"
            "failed to register layer: Error processing tar file(exit status 1): unexpected EOF\n")
    err = docker_pull.classify_pull(text)
    assert err is not None and err.kind == "disk" and err.action == "stop" and "free space" in err.meaning
    plain = docker_pull.classify_pull("error pulling image configuration: download failed: unexpected EOF")
    assert plain is not None and plain.kind == "unexpected-eof" and plain.action == "retry"
