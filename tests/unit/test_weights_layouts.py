"""Which layout step 02 writes, derived from the profile, and the hub-cache layout proven with
huggingface_hub itself (issue 13 defect 3): a bare repo id resolves offline (``HF_HUB_OFFLINE=1``)
from the tree step 02 leaves, on every node, and the shipped dspark profiles pass their own step 02
(JIT caches beside the hub cache are node-local; only ``models--org--name`` is shared)."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("huggingface_hub")

from runbook import weights as W
from runbook.checks import Status
from runbook.errors import RunbookError
from runbook.lab.hub import HubServer, publish_repo
from runbook.lab.site import site_for
from runbook.profile import load_profile
from runbook.site import SPARKS_SITE
from runbook.weights_tools import node_download
from runbook.weights import transfer as wstep
from runbook.weights_tools.layout import weights_layout
from support.doubles import FakeCluster, local_pair

REPO = "lab-org/hubcache-test"
BIG = "model-00001-of-00001.safetensors"
BIG_SIZE = 12 << 20          # > 10 MiB: huggingface_hub writes in 10 MiB pieces
CHUNK = 10 << 20


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    (src / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden": 8}))
    (src / "encoding").mkdir()
    (src / "encoding" / "encoding_dsv4.py").write_text("# the entrypoint copies this out of the snapshot\n")
    (src / BIG).write_bytes(os.urandom(BIG_SIZE))
    root = tmp_path_factory.mktemp("hubroot")
    sha = publish_repo(root, REPO, src)
    return SimpleNamespace(root=root, src=src, sha=sha)


@pytest.fixture()
def hub(repo):
    with HubServer(repo.root) as server:
        yield server


@pytest.fixture(autouse=True)
def _no_token(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)


OFFLINE = """
import json, sys
from huggingface_hub import snapshot_download, try_to_load_from_cache
repo, sha = sys.argv[1], sys.argv[2]
print(json.dumps({"bare": snapshot_download(repo), "pinned": snapshot_download(repo, revision=sha),
                  "config": try_to_load_from_cache(repo, "config.json"),
                  "big": try_to_load_from_cache(repo, sys.argv[3], revision=sha)}))
"""


def resolve_offline(hub_cache, repo, sha):
    """What a container with HF_HUB_OFFLINE=1 and this hub cache resolves (a fresh process: the
    huggingface_hub constants are read at import)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(hub_cache), HF_HOME=str(Path(hub_cache).parent / "no-such-home"))
    p = subprocess.run([sys.executable, "-c", OFFLINE, repo, sha, BIG], capture_output=True, text=True,
                       env=env, timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_repo_folder_is_huggingface_hubs_name():
    from huggingface_hub.file_download import repo_folder_name
    assert node_download.repo_folder("deepseek-ai/DeepSeek-V4-Flash-Vision-Exp") == \
        repo_folder_name(repo_id="deepseek-ai/DeepSeek-V4-Flash-Vision-Exp", repo_type="model")


def test_hub_cache_download_resolves_the_bare_repo_id_offline(repo, hub, tmp_path):
    cache = tmp_path / "hf home" / "hub"
    res = W.download(REPO, repo.sha, cache, endpoint=hub.url, margin_bytes=0, progress=False, layout="hub_cache")
    assert res.ok, res.verify
    folder = cache / node_download.repo_folder(REPO)
    snapshot = folder / "snapshots" / repo.sha
    assert res.path == str(snapshot) and res.layout == "hub_cache"
    assert (folder / "refs" / "main").read_text() == repo.sha          # verbatim: no newline
    link = snapshot / BIG
    assert link.is_symlink() and not os.path.isabs(os.readlink(link))
    import hashlib
    assert link.resolve() == folder / "blobs" / hashlib.sha256((repo.src / BIG).read_bytes()).hexdigest()
    assert [f["path"] for f in res.fetched] == [BIG]                     # through the resumable path
    assert json.loads((snapshot / W.MANIFEST_NAME).read_text())["revision"] == repo.sha
    got = resolve_offline(cache, REPO, repo.sha)
    assert got["bare"] == got["pinned"] == str(snapshot)
    assert Path(got["config"]).read_text() == (repo.src / "config.json").read_text()
    assert Path(got["big"]).read_bytes() == (repo.src / BIG).read_bytes()


def test_hub_cache_damaged_blob_is_refetched(repo, hub, tmp_path):
    cache = tmp_path / "hub"
    assert W.download(REPO, repo.sha, cache, endpoint=hub.url, margin_bytes=0, progress=False, layout="hub_cache").ok
    blob = (cache / node_download.repo_folder(REPO) / "snapshots" / repo.sha / BIG).resolve()
    os.truncate(blob, 1000)
    before = hub.bytes_sent(BIG)
    res = W.download(REPO, repo.sha, cache, endpoint=hub.url, margin_bytes=0, progress=False, layout="hub_cache")
    assert res.ok and blob.stat().st_size == BIG_SIZE
    assert hub.bytes_sent(BIG) - before == BIG_SIZE


@pytest.mark.parametrize("cut", [CHUNK + 4096, 4096])
def test_a_cut_file_continues_from_the_last_byte_written(repo, hub, tmp_path, cut):
    """Any file, of any size (the 94.6 GiB Engram shards too: no plain-HTTP size limit in the standard-library
    download), goes through its partial: a cut continues with Range from the last byte that arrived, even
    one inside the first read."""
    hub.add_fault(BIG, cut_after=cut)
    res = W.download(REPO, repo.sha, tmp_path / "w", endpoint=hub.url, margin_bytes=0, progress=False)
    assert res.ok, res.verify
    assert [f["path"] for f in res.fetched] == [BIG]
    gets = [e for e in hub.log if e.method == "GET" and e.path == BIG]
    assert len(gets) == 2 and gets[0].range == ""
    assert gets[1].range == f"bytes={cut}-"
    assert gets[1].bytes_sent == BIG_SIZE - cut


# ------------------------------------------------------------------------------ layout from the profile

def _profile(name, endpoint="", **overrides):
    p = load_profile(f"env/{name}.env", {k: str(v) for k, v in overrides.items()})
    # the in-process lab hub is plain http, which a non-lab profile refuses (a token would cross the
    # network in clear); these tests send no token, so the endpoint is set after validation
    return p.model_copy(update={"hf_endpoint": endpoint}) if endpoint else p


def test_layout_is_derived_from_model_dir_not_the_recipe():
    assert weights_layout(_profile("dspark-v4")).kind == "hub_cache"
    assert weights_layout(_profile("tp3-dspark")).kind == "hub_cache"
    assert weights_layout(_profile("exl3-v41")).kind == "local_dir"
    assert weights_layout(_profile("lab")).kind == "local_dir"
    # the recipe does not decide: recipe B serving a mounted tree is a local_dir
    assert weights_layout(_profile("dspark-v4", MODEL_DIR="/model")).kind == "local_dir"
    p = _profile("dspark-v4")
    lay = weights_layout(p)
    assert lay.store("/home/s/.cache/huggingface") == \
        "/home/s/.cache/huggingface/hub/models--deepseek-ai--DeepSeek-V4-Flash-Vision-Exp"
    assert lay.tree_in_store == f"snapshots/{p.hf_revision}"
    with pytest.raises(RunbookError, match="MODEL_DIR is a repo id other than HF_MODEL_REPO"):
        weights_layout(_profile("dspark-v4", MODEL_DIR="other-org/other"))


def test_cache_check_compares_with_what_is_shared():
    lay = weights_layout(_profile("dspark-v4"))
    home = "/home/spark/.cache/huggingface"
    ok = W.cache_dir_is_local(f"{home}/vllm-cache", [lay.store(home)])       # seed B: beside the hub cache
    assert ok.status is Status.PASS
    bad = W.cache_dir_is_local(f"{lay.store(home)}/jit", [lay.store(home)])
    assert bad.failed and "models--deepseek-ai--DeepSeek-V4-Flash-Vision-Exp" in bad.observed


@pytest.mark.slow
def test_shipped_dspark_profile_runs_its_own_step_02_on_nodes_with_different_homes(repo, hub, tmp_path):
    """env/dspark-v4.env as shipped (WEIGHTS_DIR, CACHE_DIR, WEIGHT_SYNC), only the repo, revision and
    endpoint substituted: each node downloads into ITS ~/.cache/huggingface/hub, the bare repo id
    resolves offline there, parity holds and CACHE_DIR is node-local on both."""
    p = _profile("dspark-v4", endpoint=hub.url, HF_MODEL_REPO=REPO, MODEL_DIR=REPO, HF_REVISION=repo.sha)
    assert p.weight_sync == "download-both"                      # seed B DSPARK_WORKER_HF_NFS=0
    head, worker = local_pair(tmp_path)
    checks, data = wstep.download_verify_share(FakeCluster([head, worker]), p, compare_sha256sum=False)
    assert not checks.failures(), [(c.name, c.node, c.observed) for c in checks.failures()]
    by = {(c.name, c.node): c for c in checks}
    assert by[("weights.cache_local", "head")].status is Status.PASS
    assert by[("weights.cache_local", "worker")].status is Status.PASS
    assert by[("weights.parity", "cluster")].observed == "3 files identical"
    assert data["layout"] == "hub_cache"
    for node in (head, worker):
        cache = node.home / ".cache" / "huggingface" / "hub"
        snapshot = cache / node_download.repo_folder(REPO) / "snapshots" / repo.sha
        assert data["paths"][node.name]["tree"] == str(snapshot)
        assert resolve_offline(cache, REPO, repo.sha)["bare"] == str(snapshot)
    assert not [c for n in (head, worker) for c in n.runs() if "~" in c]


def test_rsync_of_a_hub_cache_keeps_links_and_the_worker_hashes_its_own_copy(repo, hub, tmp_path):
    head, worker = local_pair(tmp_path)
    lay = weights_layout(_profile("dspark-v4", HF_MODEL_REPO=REPO, MODEL_DIR=REPO, HF_REVISION=repo.sha))
    root = "~/.cache/huggingface"
    got = W.download_on_node(head, REPO, repo.sha, lay.download_dir(f"{head.home}/.cache/huggingface"),
                             endpoint=hub.url, expected=W.fetch_metadata(REPO, repo.sha, endpoint=hub.url).expected(),
                             python=sys.executable, layout="hub_cache")
    assert got.ok
    res = W.rsync_to_worker(head, worker, lay.store(root), lay.store(root), tree=lay.tree_in_store,
                            target="localhost", ssh="sh -c 'shift; exec sh -c \"$*\"' --", python=sys.executable)
    assert res.ok, [c.to_record() for c in res.checks]
    assert next(c for c in res.checks if c.name == "weights.verified").data["files_hashed"] == 3
    cache = worker.home / ".cache" / "huggingface" / "hub"
    snapshot = Path(lay.tree(f"{worker.home}/.cache/huggingface"))
    assert (snapshot / BIG).is_symlink() and (snapshot / BIG).resolve().parent.name == "blobs"
    assert resolve_offline(cache, REPO, repo.sha)["bare"] == str(snapshot)
    assert not (cache / node_download.repo_folder(REPO) / ".cache").exists()      # partials stay on the head


def test_profiles_weight_sync_and_cache_lines():
    b = _profile("dspark-v4")
    assert (b.weights_dir, b.cache_dir, b.weight_sync) == ("~/.cache/huggingface", "~/.cache/huggingface/vllm-cache",
                                                          "download-both")
    t = _profile("tp3-dspark")
    assert (t.weights_dir, t.cache_dir) == ("~/.cache/huggingface", "~/.cache/huggingface/vllm-cache")


def test_a_rehearsal_runs_with_the_nodes_python_and_the_recipes_paths():
    """Rehearsed on the lab, a recipe profile keeps its paths and layout, and the nodes' own python3 (issue 22
    item 3: the shipped tools need no package, so the lab no longer lends the nodes the runbook's venv)."""
    p = _profile("dspark-v4")
    assert wstep.node_python(p) == "python3" and site_for(p) is SPARKS_SITE
    r = p.model_copy(update={"rehearsal": True, "lab": True})
    assert site_for(r).on_lab and site_for(r).nfs_stand_in is not None and wstep.node_python(r) == "python3"
    assert weights_layout(r) == weights_layout(p)
