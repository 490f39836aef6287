"""Recipe A's ship on a Spark's kind of Docker: Debian's docker.io 28 with the containerd image store in the nodes.

The lab's own dockerd (bookworm's 20.10, classic store) never runs ``docker save --platform``; here a second
daemon per node (``runbook.lab.netlab.docker_c8d``: real Debian binaries, the containerd store, the lab registry
trusted) is what the nodes' ``docker`` means, and the runbook's own ``ensure_image`` pulls recipe A's two-platform
index on the head and ships it to the worker.

- the ship saves the node's platform with ``--platform`` (API 1.48+ here) and the layers are identical after;
- the defect ``--platform`` removes, on real containerd: a whole-index save of an index the head pulled for one
  platform names the other platform's manifest, which the tar does not hold; an importer that takes the archive's
  platforms as they are (``ctr images import --all-platforms``, kind's and k8s' side-loads) fails on exactly that
  digest, while the ``--platform`` tar imports. What Docker's own ``docker load`` does with the whole tar is
  recorded, not asserted (it picks its platform and accepted it in 20.10, 26.1 and 28.5 when measured).
"""
from __future__ import annotations

import json

import pytest

from runbook.checks import Status
from runbook.errors import LabError
from runbook.lab import control, oci
from runbook.lab.netlab import docker_c8d
from runbook.lab.netlab.host import ssh
from runbook.lab.rehearsal import load_rehearsal
from runbook.launch import image
from runbook.profile import REPO_ROOT
from runbook.remote import Cluster, quote

pytestmark = [pytest.mark.lab, pytest.mark.slow]

RECORDED: dict[str, object] = {}


@pytest.fixture(scope="module")
def c8d(lab):
    """Debian's docker.io 28 unpacked in the lab dir and started in every node; stopped at the end."""
    try:
        root = docker_c8d.provision(lab.lab_dir, print)
    except LabError as exc:            # deb.debian.org out of reach: nothing here can be shown
        pytest.skip(f"Debian's docker.io 28 is not available: {exc}")
    for node in lab.nodes:
        out = ssh(lab.ssh_config, node.alias, docker_c8d.start_script(root, node.netns), timeout=60,
                  what=f"starting the containerd-store dockerd on {node.alias}").stdout.strip()
        assert "io.containerd.snapshotter" in out, (node.alias, out)
        RECORDED.setdefault("daemons", {})[node.name] = out
    yield root
    for node in lab.nodes:
        ssh(lab.ssh_config, node.alias, docker_c8d.stop_script(), timeout=30, check=False)
    print("\n[c8d ship] " + json.dumps(RECORDED, indent=1))


def _recipe_a(lab, root):
    """env/exl3-v41.env as rehearsed (its IMAGE at the lab registry, a moving tag: pull on the head, then ship),
    the image pushed and removed from the c8d daemons, and a cluster whose `docker` is the c8d daemon."""
    profile, _, _ = load_rehearsal(REPO_ROOT / "env/exl3-v41.env", publish=True, echo=lambda _l: None)
    control.ensure_rehearsal_image(profile, lab, echo=print)
    prefix = docker_c8d.command_prefix(root)
    for node in lab.nodes:
        ssh(lab.ssh_config, node.alias, f"{prefix}docker rmi -f {quote(profile.image)} >/dev/null 2>&1; true",
            timeout=60)
    return profile, prefix


def test_recipe_a_ships_the_node_platform_from_a_containerd_store(lab, c8d):
    profile, prefix = _recipe_a(lab, c8d)
    native = oci.native_platform()
    with Cluster.from_profile(profile) as cluster:
        for node in cluster.nodes:
            node.command_prefix += prefix
        facts = image.parse_ship_facts(cluster.head.read(image.ship_facts_cmd("none")).stdout,
                                       cluster.worker.read(image.TARGET_PLATFORM_CMD).stdout)
        assert facts.containerd_store and facts.target_platform == native, facts
        out = image.ensure_image(cluster, profile)
        assert out.data["plan"] == "pull-head" and not out.failures(), out.to_text()
        shipped = out.data["shipped"]
        assert shipped["worker"]["save"].startswith(f"docker save --platform {native} "), shipped
        rows = {(c.name, c.node): c for c in out}
        assert rows[("runtime image identical", "cluster")].status is Status.PASS
        # the containerd store names an image by its index: the head's is the pulled index, the worker's the
        # manifest of its one platform (hence the identity by layer digests)
        ids = {n.name: n.read(f"docker image inspect --format '{{{{.Id}}}}' {quote(profile.image)}").stdout.strip()
               for n in cluster.nodes}
        RECORDED["recipe_a"] = {"facts": facts.__dict__, "pull_head_s": shipped["head"]["seconds"],
                                "ship_s": shipped["worker"]["seconds"], "save": shipped["worker"]["save"], "ids": ids}
        assert ids["head"] == control.lab_image().digest, ids


def test_a_whole_index_save_names_a_manifest_it_does_not_hold(lab, c8d):
    profile, prefix = _recipe_a(lab, c8d)
    native = oci.native_platform()
    index = control.lab_image()
    missing = index.image_of(oci.other_platform(native)).digest      # the platform the head never pulled
    head, worker = lab.head.alias, lab.nodes[1].alias
    ctr = f"{prefix}ctr -a {docker_c8d.CONTAINERD_SOCKET} -n lab-import"
    ssh(lab.ssh_config, head, f"{prefix}docker pull -q {quote(profile.image)}", timeout=300)
    # the two saves: today's (the node's platform) and the one the ship made before `--platform`
    ssh(lab.ssh_config, head, f"{prefix}mkdir -p /mnt/nvme/c8d-ship && "
        f"docker save --platform {native} -o /mnt/nvme/c8d-ship/one.tar {quote(profile.image)} && "
        f"docker save -o /mnt/nvme/c8d-ship/whole.tar {quote(profile.image)}", timeout=300)
    try:
        listing = ssh(lab.ssh_config, head, "tar -tf /mnt/nvme/c8d-ship/whole.tar; echo ---; "
                      "tar -xOf /mnt/nvme/c8d-ship/whole.tar index.json", timeout=60).stdout
        names, _, index_json = listing.partition("---")
        outer = json.loads(index_json)["manifests"]
        assert outer and outer[0]["digest"] == index.digest, outer       # the whole index, as pulled
        assert f"blobs/sha256/{missing.split(':')[1]}" not in names.split(), "the tar holds the other platform"
        ssh(lab.ssh_config, head, "rsync -a /mnt/nvme/c8d-ship/ /tmp/c8d-ship-to-worker/", timeout=60)
        ssh(lab.ssh_config, worker, f"{ctr} images rm {quote(profile.image)} >/dev/null 2>&1; true", timeout=60)
        # the lab nodes share this machine's /tmp: the worker reads the head's tars there
        whole = ssh(lab.ssh_config, worker, f"{ctr} images import --all-platforms /tmp/c8d-ship-to-worker/whole.tar",
                    timeout=120, check=False)
        ssh(lab.ssh_config, worker, f"{ctr} images rm {quote(profile.image)} >/dev/null 2>&1; true", timeout=60)
        one = ssh(lab.ssh_config, worker, f"{ctr} images import --all-platforms /tmp/c8d-ship-to-worker/one.tar",
                  timeout=120, check=False)
        loaded = ssh(lab.ssh_config, worker, f"{prefix}docker rmi -f {quote(profile.image)} >/dev/null 2>&1; "
                     "docker load -i /tmp/c8d-ship-to-worker/whole.tar", timeout=120, check=False)
        RECORDED["whole_index"] = {"ctr_whole": (whole.stdout + whole.stderr).strip()[-300:],
                                   "ctr_one": (one.stdout + one.stderr).strip()[-300:],
                                   "docker_load_whole": f"rc={loaded.returncode} "
                                                        f"{(loaded.stdout + loaded.stderr).strip()[-200:]}"}
        assert whole.returncode != 0 and missing in whole.stderr and "not found" in whole.stderr, whole
        assert one.returncode == 0, one
    finally:
        ssh(lab.ssh_config, head, "rm -rf /mnt/nvme/c8d-ship /tmp/c8d-ship-to-worker", timeout=60, check=False)
