"""The runtime image shipped to a worker (issue 22, defect 1): the tar holds the node's platform, a worker
whose pull fails gets the head's image even when the head had to pull it first, and a `docker load` of an
index's missing blobs says what to do."""
from __future__ import annotations

from pathlib import Path

import pytest

from runbook.errors import ActionError
from runbook.launch.image import ShipFacts, ensure_image, parse_ship_facts, save_command
from runbook.profile import load_profile
from support.counts import seeing
from support.doubles import FakeCluster, FakeNode, res

ENV = Path(__file__).resolve().parents[2] / "env"
LAYERS = '["sha256:l1","sha256:l2"]'
IMAGE_ID = "sha256:" + "a" * 64


def test_parse_ship_facts():
    f = parse_ship_facts('1.48 1.49\n[["driver-type","io.containerd.snapshotter.v1"]]\nlinux/arm64\n', "linux/arm64\n")
    assert f == ShipFacts("1.48", "1.49", True, "linux/arm64", "linux/arm64")
    classic = parse_ship_facts('1.47 1.47\n[["Backing Filesystem","extfs"]]\nlinux/arm64/v8\n', "linux/arm64")
    assert not classic.containerd_store and classic.image_platform == "linux/arm64/v8"
    assert parse_ship_facts("", "Cannot connect to the Docker daemon").target_platform == ""


def test_save_command_names_the_target_platform():
    new = ShipFacts("1.48", "1.51", True, "linux/arm64", "linux/arm64")
    assert save_command("img:t", "/s/x.tar", new) == "docker save --platform linux/arm64 -o /s/x.tar img:t"
    assert save_command("img:t", "-", new) == "docker save --platform linux/arm64 img:t"       # to stdout
    # an older client caps the API: no --platform flag; the containerd store may hold an index: refused
    with pytest.raises(ActionError) as err:
        save_command("img:t", "/s/x.tar", ShipFacts("1.47", "1.51", True, "linux/arm64", "linux/arm64"))
    assert "28" in err.value.fix and "blobs/sha256" in err.value.fix
    # the classic store keeps one platform's image: a plain save is whole
    assert save_command("img:t", "/s/x.tar", ShipFacts("1.45", "1.45", False, "linux/arm64", "linux/arm64")) \
        == "docker save -o /s/x.tar img:t"
    with pytest.raises(ActionError) as err:                       # the head holds another platform's image
        save_command("img:t", "/s/x.tar", ShipFacts("1.48", "1.48", False, "linux/amd64", "linux/arm64"))
    assert "docker pull --platform linux/arm64 img:t" in err.value.fix
    with pytest.raises(ActionError):
        save_command("img:t", "/s/x.tar", ShipFacts("1.48", "1.48", False, "linux/arm64", ""))


TAR_BYTES = 1_050_000                 # the saved tar: a little more than the image's 1,000,000 bytes
# what dd (status=progress, \r between updates) and rsync (--info=progress2) print while they go
DD_SAVE = ("\r400000 bytes (400 kB, 391 KiB) copied, 1 s, 400 kB/s\r1000000 bytes (1.0 MB, 977 KiB) copied, 2 s, "
           "500 kB/s\n0+1 records in\n0+1 records out\n1050000 bytes (1.1 MB, 1.0 MiB) copied, 2.1 s, 500 kB/s\n")
DD_LOAD = ("\r600000 bytes (600 kB, 586 KiB) copied, 1 s, 600 kB/s\n"
           "1050000 bytes (1.1 MB, 1.0 MiB) copied, 1.7 s, 617 kB/s\n")
RSYNC = "\r        524,288  49%  500.00kB/s    0:00:01\r      1,050,000 100%  512.00kB/s    0:00:02 (xfr#1, to-chk=0/1)\n"


def _nodes(*, worker_pull_ok: bool, load_err: str = ""):
    present = {"head": False, "worker": False}

    def inspect(name):
        return lambda _c: (f"{IMAGE_ID} {LAYERS}" if present[name] else "Error: No such image: x")

    def pull(name, ok):
        def answer(_c):
            if ok:
                present[name] = True
                return res(0, "pulled")
            return res(1, "", "Error response from daemon: Get https://ghcr.io/v2/: dial tcp: lookup ghcr.io: "
                              "no such host")
        return answer

    def load(_c):
        if load_err:
            return res(1, "", load_err)
        present["worker"] = True
        return res(0, "Loaded image", DD_LOAD)

    df = "/home/u/.cache\n900000000000 1000000000000 /\n"
    common = [(r"^printf %s \"\$HOME\"$", "/home/u"), (r"^mkdir -p ", ""), (r"df -B1", df), (r"^rm -f ", "")]
    head = FakeNode("head", 0, rules=[
        (r"^docker version --format '\{\{\.Client", '1.48 1.48\n[["driver-type","io.containerd.snapshotter.v1"]]\n'
                                                     "linux/arm64\n"),
        (r"\{\{\.Id\}\} \{\{json \.RootFS\.Layers\}\}", inspect("head")),
        (r"\{\{\.Size\}\}", "1000000"), (r"^docker pull ", pull("head", True)),
        (r"^set -o pipefail; docker save ", res(0, "", DD_SAVE)), (r"^stat -c %s ", f"{TAR_BYTES}\n"),
        (r"^rsync ", RSYNC), *common])
    worker = FakeNode("worker", 1, rules=[
        (r"\{\{\.Id\}\} \{\{json \.RootFS\.Layers\}\}", inspect("worker")),
        (r"^docker version --format '\{\{\.Server\.Os", "linux/arm64\n"),
        (r"^docker pull ", pull("worker", worker_pull_ok)), (r"^set -o pipefail; dd if=.* \| docker load\Z", load),
        *common])
    return head, worker


def test_pinned_image_missing_on_head_worker_pull_fails_ships_from_head():
    """Defect 1b: the head pulls the digest-pinned image, the worker cannot reach the registry: the head's
    image is shipped with the worker's platform (a4d36a1 skipped the ship and failed 'identical')."""
    profile = load_profile(ENV / "dspark-v4.env")
    head, worker = _nodes(worker_pull_ok=False)
    out = ensure_image(FakeCluster([head, worker]), profile)
    rows = {(c.name, c.node): c for c in out}
    assert rows[("runtime image identical", "cluster")].status.value == "PASS", [str(c) for c in out]
    assert rows[("image pulled", "worker")].status.value == "WARN"
    saves = [c for c in head.runs() if c.startswith("set -o pipefail; docker save ")]
    assert saves and all("--platform linux/arm64" in c for c in saves), head.runs()
    assert any(c.endswith("| docker load") for c in worker.runs())
    assert out.data["shipped"]["worker"]["platform"] == "linux/arm64"


def test_load_of_missing_index_blobs_names_the_fix():
    profile = load_profile(ENV / "exl3-v41.env")
    head, worker = _nodes(worker_pull_ok=False, load_err=(
        "open /var/lib/docker/tmp/docker-import-123/blobs/sha256/" + "c" * 64 + ": no such file or directory"))
    out = ensure_image(FakeCluster([head, worker]), profile)
    shipped = [c for c in out if c.name == "image shipped"]
    assert shipped and shipped[0].failed
    assert "multi-arch index" in shipped[0].fix and "--platform" in shipped[0].fix


def test_a_failed_pull_keeps_its_output_for_the_catalogue():
    """Issue 23: the worker's failed pull is kept (``data["pull_failed"]``) for the diagnose catalogue's
    docker-pull rows, which 04 matches; the pull times are recorded per node."""
    from runbook.facts import docker_pull
    profile = load_profile(ENV / "dspark-v4.env")
    head, worker = _nodes(worker_pull_ok=False)
    out = ensure_image(FakeCluster([head, worker]), profile)
    assert sorted(out.data["pull_failed"]) == ["worker"]
    assert docker_pull.classify_pull(out.data["pull_failed"]["worker"]).kind == "dns"
    assert out.data["shipped"]["head"]["pulled"] is True and out.data["shipped"]["head"]["seconds"] >= 0


def test_only_a_pull_that_stopped_the_image_step_goes_to_the_catalogue():
    from runbook.launch.diagnosis import failed_pulls
    profile = load_profile(ENV / "dspark-v4.env")
    head, worker = _nodes(worker_pull_ok=False)
    shipped = ensure_image(FakeCluster([head, worker]), profile)          # the worker's pull failed, the ship worked
    assert shipped.data["pull_failed"] and failed_pulls(shipped) == {}
    head, worker = _nodes(worker_pull_ok=False, load_err="no space left on device")   # the ship fails too
    stopped = ensure_image(FakeCluster([head, worker]), profile)
    assert stopped.failures() and sorted(failed_pulls(stopped)) == ["worker"]
    assert failed_pulls(None) == {}


def test_the_ship_counts_each_phases_bytes_up_to_the_tar(monkeypatch):
    """Issue 38 item 2: the save (dd), the copy (rsync progress2) and the load (dd) report through runbook.progress
    as ``<node> image save|copy|load``: rising counts that end at the tar's size (the save's total starts as the
    image's size and becomes the tar's once it is written)."""
    with seeing() as seen:
        head, worker = _nodes(worker_pull_ok=False)
        out = ensure_image(FakeCluster([head, worker]), load_profile(ENV / "dspark-v4.env"))
    assert not out.failures(), [str(c) for c in out]
    for phase, between in (("save", [400000, 1000000]), ("copy", [524288]), ("load", [600000])):
        shown = [s for s in seen.shown if s[0] == f"worker image {phase}"]
        assert [s[1] for s in shown] == [*between, TAR_BYTES, TAR_BYTES], (phase, shown)
        assert shown[-1] == (f"worker image {phase}", TAR_BYTES, TAR_BYTES, True)
    assert out.data["shipped"]["worker"]["tar_bytes"] == TAR_BYTES
