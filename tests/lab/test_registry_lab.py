"""The lab registry (issue 23 item 1) with the real Debian ``docker-registry`` and the nodes' real dockerd:

- recipe B's image (``env/dspark-v4.env`` as rehearsed): pulled by digest on every node from the lab registry;
- recipe A's image (``env/exl3-v41.env``): pulled on the head, then shipped to the worker by the runbook's own
  ship path, from a two-platform index (the node's platform and linux/arm64) that the registry really serves;
- the ship path's platform rules against what the real docker answers (a head image of the other platform is
  refused before anything is saved; ``docker save --platform`` where this daemon's API cannot take it);
- a pull that fails (a digest the registry does not have; the registry stopped) reaches the diagnose catalogue's
  ``docker-pull-*`` rows.

Measured here (printed at the end): the push of the lab image into an empty repository and again, each node's
pull, and the ship head -> worker.
"""
from __future__ import annotations

import json
import time

import pytest

from runbook.checks import Status
from runbook.diagnose import bundle as B
from runbook.facts import docker_pull
from runbook.lab import control, oci
from runbook.lab.netlab import registry
from runbook.lab.netlab.spec import REGISTRY
from runbook.lab.rehearsal import load_rehearsal
from runbook.launch import diagnosis, image
from runbook.profile import REPO_ROOT
from runbook.remote import Cluster, quote
from runbook.secrets import Redactor


def lab_dir():
    import os
    from pathlib import Path
    from runbook.lab import netlab
    return Path(os.environ.get("RUNBOOK_LAB_DIR") or netlab.default_lab_dir())


def _api(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split(".")) if version else (0, 0)

pytestmark = [pytest.mark.lab, pytest.mark.slow]

TIMINGS: dict[str, object] = {}


@pytest.fixture(scope="module", autouse=True)
def report_timings():
    yield
    if TIMINGS:
        print("\n[registry timings] " + json.dumps(TIMINGS, indent=1))


def _rehearsed(path: str):
    profile, _, _ = load_rehearsal(REPO_ROOT / path, publish=True, echo=lambda _l: None)
    return profile


def _rows(checks) -> dict[tuple[str, str], object]:
    return {(c.name, c.node): c for c in checks}


def test_the_registry_runs_and_every_node_trusts_it(lab):
    from runbook.lab import netlab
    st = netlab.status(lab_dir())
    assert st["registry"]["healthy"] and st["registry"]["address"] == REGISTRY, st["registry"]
    assert st["nodes"] and all(n["registry_insecure"] for n in st["nodes"].values()), st["nodes"]
    assert registry.answers(REGISTRY)


def test_a_push_of_the_lab_image_takes_seconds():
    index = control.lab_image()
    repo = f"tests/push-{int(time.time() * 1000)}"          # a new repository: every blob is uploaded
    first = oci.push(REGISTRY, repo, "t", index)
    again = oci.push(REGISTRY, repo, "t", index)
    TIMINGS["push_cold"] = {"seconds": first.seconds, "bytes": first.bytes_sent, "blobs": first.blobs_sent}
    TIMINGS["push_again"] = {"seconds": again.seconds, "blobs_present": again.blobs_present}
    assert first.blobs_sent == 4 and again.blobs_sent == 0 and first.digest == again.digest == index.digest
    assert first.seconds < 20, first
    assert oci.manifest_platforms(REGISTRY, repo, "t") == index.platforms and len(index.platforms) == 2


def test_recipe_b_pulls_by_digest_on_every_node(lab):
    profile = _rehearsed("env/dspark-v4.env")
    ref = oci.parse_reference(profile.image)
    assert ref.host == REGISTRY and ref.path == "anemll/dspark-vllm-gx10" and ref.tag == "0.1.1"
    pushed = control.ensure_rehearsal_image(profile, lab, echo=print)
    assert pushed.digest == ref.digest
    with Cluster.from_profile(profile) as cluster:
        assert all(i is None for i in image.image_infos(cluster, profile.image).values())   # removed: a real pull
        out = image.ensure_image(cluster, profile)
        rows = _rows(out)
        assert out.data["plan"] == "pull" and not out.failures(), out.to_text()
        assert rows[("runtime image identical", "cluster")].status is Status.PASS
        assert sorted(out.data["shipped"]) == ["head", "worker"]
        assert all(v["pulled"] for v in out.data["shipped"].values()), out.data["shipped"]
        TIMINGS["pull_by_digest"] = {n: v["seconds"] for n, v in out.data["shipped"].items()}
        native = oci.native_platform()
        for node in cluster.nodes:
            facts = node.read(f"docker image inspect --format '{{{{json .RepoDigests}}}} {{{{.Os}}}}/{{{{.Architecture}}}}' "
                              f"{quote(profile.image)}", timeout=30).stdout.strip()
            assert f"{REGISTRY}/{ref.path}@{ref.digest}" in facts and facts.endswith(native), (node.name, facts)


def test_recipe_a_pulls_on_the_head_and_ships_the_node_platform_to_the_worker(lab):
    profile = _rehearsed("env/exl3-v41.env")
    ref = oci.parse_reference(profile.image)
    assert ref.host == REGISTRY and ref.tag == "2.9bpw" and not ref.digest
    control.ensure_rehearsal_image(profile, lab, echo=print)
    assert oci.manifest_platforms(REGISTRY, ref.path, ref.tag) == [oci.native_platform(),
                                                                   oci.other_platform(oci.native_platform())]
    with Cluster.from_profile(profile) as cluster:
        out = image.ensure_image(cluster, profile)
        assert out.data["plan"] == "pull-head" and not out.failures(), out.to_text()
        shipped = out.data["shipped"]
        assert shipped["head"]["pulled"] and shipped["worker"]["platform"] == oci.native_platform(), shipped
        assert _rows(out)[("runtime image identical", "cluster")].status is Status.PASS
        TIMINGS["recipe_a"] = {"pull_head_s": shipped["head"]["seconds"], "ship_s": shipped["worker"]["seconds"],
                               "ship_bytes": shipped["worker"]["bytes"], "save": shipped["worker"]["save"]}
        # what this daemon answers decides the save: record it with the command the ship ran
        facts = image.parse_ship_facts(cluster.head.read(image.ship_facts_cmd(profile.image)).stdout,
                                       cluster.worker.read(image.TARGET_PLATFORM_CMD).stdout)
        TIMINGS["docker_facts"] = facts.__dict__
        takes_platform = min(_api(facts.client_api), _api(facts.server_api)) >= image.SAVE_PLATFORM_API
        assert shipped["worker"]["save"].startswith("docker save --platform " if takes_platform else "docker save ")


def test_the_ship_refuses_the_other_platforms_image_before_saving(lab):
    """The head holds the index's other platform (pulled with --platform): the ship stops before `docker save`
    with the fix, instead of loading an image the worker cannot run."""
    profile = _rehearsed("env/exl3-v41.env")
    control.ensure_rehearsal_image(profile, lab, echo=print)
    other = oci.other_platform(oci.native_platform())
    with Cluster.from_profile(profile) as cluster:
        pulled = cluster.head.run(f"docker pull --platform {other} {quote(profile.image)}", timeout=300, warn=True)
        assert pulled.ok, pulled.stderr
        out = image.ensure_image(cluster, profile)
        assert out.data["plan"] == "ship", out.data
        failed = _rows(out)[("image shipped", "worker")]
        assert failed.failed and other in failed.observed and f"--platform {oci.native_platform()}" in failed.fix
        assert not any("docker save" in c for c in _commands(cluster, "head")), "saved before refusing"
        control.ensure_rehearsal_image(profile, lab, echo=print)            # leave no foreign image behind


def test_save_with_platform_where_this_daemon_cannot_take_it(lab):
    """The ship adds `--platform` only where CLI and daemon speak API 1.48: the lab's dockerd (Debian's docker.io)
    speaks less, and the real docker then refuses the flag; the ship path gave the plain save and it loaded."""
    profile = _rehearsed("env/exl3-v41.env")
    control.ensure_rehearsal_image(profile, lab, echo=print)
    with Cluster.from_profile(profile) as cluster:
        facts = image.parse_ship_facts(cluster.head.read(image.ship_facts_cmd("x")).stdout,
                                       cluster.worker.read(image.TARGET_PLATFORM_CMD).stdout)
        if min(_api(facts.client_api), _api(facts.server_api)) >= image.SAVE_PLATFORM_API:
            pytest.skip(f"this docker takes `docker save --platform` (API {facts.server_api})")
        cluster.head.run(f"docker pull {quote(profile.image)}", timeout=300)
        forced = cluster.head.run(f"docker save --platform {oci.native_platform()} -o /tmp/forced.tar "
                                  f"{quote(profile.image)}", timeout=120, warn=True)
        cluster.head.run("rm -f /tmp/forced.tar", timeout=30)
        TIMINGS["forced_platform_save"] = (forced.stdout + forced.stderr).strip()[-300:]
        assert not forced.ok and "1.48" in forced.stderr + forced.stdout, forced


def _commands(cluster, node: str) -> list[str]:
    log = cluster.log.path
    if log is None or not log.exists():
        return []
    return [json.loads(l)["command"] for l in log.read_text().splitlines() if json.loads(l)["node"] == node]


def _failed_pull_findings(cluster, profile, run_dir) -> tuple[dict, list]:
    out = image.ensure_image(cluster, profile)
    pulls = out.data.get("pull_failed") or {}
    assert pulls and any(c.name == "image pulled" and c.failed for c in out), out.to_text()
    _, findings = diagnosis.diagnose_server(cluster, profile, run_dir, Redactor(), pulls=pulls)
    return pulls, findings


def test_failed_pulls_reach_the_catalogue(lab, tmp_path):
    """A digest the registry does not hold -> docker-pull-manifest-unknown; the registry stopped ->
    docker-pull-unreachable; each named on the node whose pull failed, with the docker error as evidence."""
    profile = _rehearsed("env/dspark-v4.env")
    control.ensure_rehearsal_image(profile, lab, echo=print)
    ref = oci.parse_reference(profile.image)
    wrong_digest = oci.sha256(b"no image has this content")
    from runbook.profile import load_profile
    _, overrides, _ = load_rehearsal(REPO_ROOT / "env/dspark-v4.env", publish=True, echo=lambda _l: None)
    wrong = load_profile(REPO_ROOT / "env/dspark-v4.env",
                         overrides={**overrides, "IMAGE": str(ref.replace(digest=wrong_digest))})
    with Cluster.from_profile(wrong, run_dir=tmp_path) as cluster:
        pulls, findings = _failed_pull_findings(cluster, wrong, tmp_path)
    TIMINGS["wrong_digest_output"] = pulls["head"][-300:]
    assert docker_pull.classify_pull(pulls["head"]).kind == "manifest-unknown", pulls
    ids = {(f.id, f.node) for f in findings}
    assert ("docker-pull-manifest-unknown", "head") in ids, [f.id for f in findings]
    rows = diagnosis.finding_checks(findings, next((tmp_path / "diagnose").glob("*.tar.gz")), tmp_path)
    assert any(r.name == "diagnose.docker-pull-manifest-unknown" and r.status is Status.WARN for r in rows)

    note = registry.stop_registry(lab_dir())
    assert note and not registry.answers(REGISTRY)
    try:
        with Cluster.from_profile(profile, run_dir=tmp_path) as cluster:
            pulls, findings = _failed_pull_findings(cluster, profile, tmp_path)
    finally:
        registry.start_registry(lab_dir(), print)
    TIMINGS["registry_down_output"] = pulls["head"][-300:]
    assert docker_pull.classify_pull(pulls["head"]).kind == "unreachable", pulls
    assert ("docker-pull-unreachable", "head") in {(f.id, f.node) for f in findings}, [f.id for f in findings]
    # the captured output is what the unit suite's fixture holds (tests/unit/diagnose/data/docker_pull_unreachable)
    assert B.DOCKER_PULL == "docker_pull.txt"
