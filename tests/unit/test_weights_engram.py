"""Step 02 fetches the Engram source (issue 13 defect 4): HF_ENGRAM_REPO@HF_ENGRAM_REVISION, pinned,
only config.json, the index and the shards holding the tables (recipe A: shards 47/48), resumable and
sha256-verified like the model, into ENGRAM_SRC_DIR on every node that packs, each node's ``~``
its own. Then 03_engram's own source check accepts what 02 left there."""
import json
import os
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("huggingface_hub")

from runbook.checks import Status
from runbook.engram import facts as engram_facts
from runbook.engram import precheck as engram_precheck
from runbook.errors import RunbookError
from runbook.lab.hub import ENGRAM_OTHER_SHARD, HubServer, publish_engram_source, publish_repo
from runbook.lab.site import site_for
from runbook.profile import load_profile
from runbook.weights import MANIFEST_NAME
from runbook.weights import transfer as wstep
from support.doubles import FakeCluster, local_pair

MODEL = "lab-org/exl3-tiny"
ENGRAM = "lab-org/v41-engram-src"
SHARDS = ["model-00047-of-00048.safetensors", "model-00048-of-00048.safetensors"]


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    root = tmp_path_factory.mktemp("hubroot")
    src = tmp_path_factory.mktemp("model")
    (src / "config.json").write_text(json.dumps({"model_type": "tiny"}))
    (src / "model-00001-of-00001.safetensors").write_bytes(os.urandom(1 << 20))
    plain = tmp_path_factory.mktemp("plain")          # a checkpoint whose index maps no Engram table
    (plain / "config.json").write_text("{}")
    (plain / ENGRAM_OTHER_SHARD).write_bytes(os.urandom(1 << 16))
    (plain / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"layers.0.attn.wq_a.weight": ENGRAM_OTHER_SHARD}}))
    return SimpleNamespace(root=root, model_sha=publish_repo(root, MODEL, src),
                           engram_sha=publish_engram_source(root, ENGRAM, vocab=1200),
                           plain_sha=publish_repo(root, "lab-org/no-engram", plain))


@pytest.fixture()
def hub(published):
    with HubServer(published.root) as server:
        yield server


@pytest.fixture(autouse=True)
def _no_token(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)


def exl3(published, endpoint, **overrides):
    """env/exl3-v41.env as shipped (its ~ paths, ENGRAM=1), with the lab hub's repos substituted and
    WEIGHT_SYNC=download-both (kernel NFS cannot run here). The http endpoint is set after validation:
    a non-lab profile refuses plain http for the token's sake, and these tests send none."""
    values = {"HF_MODEL_REPO": MODEL, "HF_REVISION": published.model_sha, "HF_ENGRAM_REPO": ENGRAM,
              "HF_ENGRAM_REVISION": published.engram_sha, "WEIGHT_SYNC": "download-both", "ENGRAM_GIB": "0",
              **overrides}
    return load_profile("env/exl3-v41.env", values).model_copy(update={"hf_endpoint": endpoint})


def test_engram_files_follow_the_index():
    index = {"weight_map": {"layers.1.engram.embed.weight": SHARDS[0], "layers.1.engram.embed.scale": SHARDS[0],
                            "layers.14.engram.embed.weight": SHARDS[1], "layers.0.attn.wq_a.weight": ENGRAM_OTHER_SHARD,
                            "layers.1.engram.k_weight": SHARDS[0]}}
    assert wstep.engram_files(index) == ["config.json", "model.safetensors.index.json", *SHARDS]
    assert wstep.engram_shards({"weight_map": {"layers.0.attn.wq_a.weight": ENGRAM_OTHER_SHARD}}) == []


@pytest.mark.slow
def test_step_02_brings_the_engram_source_to_every_packing_node_and_a_rerun_fetches_nothing(published, hub, tmp_path):
    p = exl3(published, hub.url)
    head, worker = local_pair(tmp_path)
    checks, data = wstep.download_verify_share(FakeCluster([head, worker]), p, compare_sha256sum=False)
    assert not checks.failures(), [(c.name, c.node, c.observed) for c in checks.failures()]
    names = [(c.name, c.node) for c in checks if c.name.startswith("weights.engram.")]
    assert ("weights.engram.verified", "head") in names and ("weights.engram.verified", "worker") in names
    assert ("weights.engram.parity", "cluster") in names
    assert data["engram"]["files"] == ["config.json", "model.safetensors.index.json", *SHARDS]
    for node in (head, worker):
        src = node.home / ".cache" / "dsv41-flash-exl3" / "engram-src"        # the shipped ENGRAM_SRC_DIR
        assert data["engram"]["paths"][node.name] == str(src)
        assert sorted(f.name for f in src.iterdir() if not f.name.startswith(".")) == \
            sorted(["config.json", "model.safetensors.index.json", *SHARDS])
        assert json.loads((src / MANIFEST_NAME).read_text())["revision"] == published.engram_sha
        assert (node.home / ".cache" / "dsv41-flash-exl3" / "model" / "config.json").is_file()
    # only what recipe A downloads crossed the wire (twice: one download per node)
    fetched = {e.path for e in hub.log if e.method == "GET" and "/" not in e.path}
    assert ENGRAM_OTHER_SHARD not in fetched and "tokenizer.json" not in fetched
    assert all(sum(1 for e in hub.log if e.method == "GET" and e.path == s) == 2 for s in SHARDS)
    # the JIT cache is checked against the Engram source too, per node
    assert [c.status for c in checks if c.name == "weights.cache_local"] == [Status.PASS, Status.PASS]

    # 03_engram reads the source 02 left, on each node, with its own probes: accepted
    cluster = FakeCluster([head, worker])
    facts = engram_facts.gather_facts(cluster, p, {n: {"python": "python3"} for n in ("head", "worker")})
    rows = engram_precheck.source_checks(p, facts)
    assert [r.name for r in rows if r.name == "engram source"] == ["engram source", "engram source"]
    assert not [r for r in rows if r.failed], [(r.name, r.node, r.observed) for r in rows if r.failed]

    # a second run fetches nothing: the only body fetched again is the index the runbook itself reads
    seen = len(hub.log)
    again, _ = wstep.download_verify_share(FakeCluster([head, worker]), p, compare_sha256sum=False)
    assert not again.failures()
    assert [e.path for e in hub.log[seen:] if e.method == "GET" and e.bytes_sent] == ["model.safetensors.index.json"]
    hashed = [c.data.get("files_hashed") for c in again if c.name == "weights.engram.verified"]
    assert hashed == [0, 0]                                     # the manifests vouch for unchanged files


def test_unpinned_engram_revision_is_refused_before_any_engram_byte(published, hub, tmp_path):
    """The profile refuses a branch already; the step refuses it too when handed one."""
    p = exl3(published, hub.url).model_copy(update={"hf_engram_revision": "main"})
    head, worker = local_pair(tmp_path)
    with pytest.raises(RunbookError, match="HF_ENGRAM_REVISION is not a pinned commit"):
        wstep.engram_source(FakeCluster([head, worker]), p, python=sys.executable,
                            endpoint=hub.url, margin=0)
    assert not [e for e in hub.log if ENGRAM in e.path or e.path in SHARDS]


def test_a_repo_without_engram_tables_is_refused_by_name(published, hub, tmp_path):
    head, worker = local_pair(tmp_path)
    cluster = FakeCluster([head, worker])
    p = exl3(published, hub.url, HF_ENGRAM_REPO="lab-org/no-engram", HF_ENGRAM_REVISION=published.plain_sha)
    rows, _ = wstep.engram_source(cluster, p, python=sys.executable, endpoint=hub.url, margin=0)
    assert [(r.name, r.status) for r in rows] == [("weights.engram.source", Status.FAIL)]
    assert "maps no '.engram.embed.' tensor" in rows[0].observed and "HF_ENGRAM_REPO" in rows[0].fix
    p = exl3(published, hub.url, HF_ENGRAM_REPO=MODEL, HF_ENGRAM_REVISION=published.model_sha)   # no index at all
    with pytest.raises(RunbookError, match="cannot read model.safetensors.index.json"):
        wstep.engram_source(cluster, p, python=sys.executable, endpoint=hub.url, margin=0)
    assert not [c for n in (head, worker) for c in n.runs()]


def test_the_lab_profile_keeps_its_synthetic_source(tmp_path):
    p = load_profile("env/lab.env")
    assert p.engram
    head, worker = local_pair(tmp_path)
    rows, data = wstep.engram_source(FakeCluster([head, worker]), p, python=sys.executable,
                                     endpoint=None, margin=0, site=site_for(p))
    assert [(r.name, r.status) for r in rows] == [("weights.engram.source", Status.NA)]
    assert "prepare_lab_source" in rows[0].observed and head.commands == [] and worker.commands == []
