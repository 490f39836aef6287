"""The lab Hub endpoint against the real huggingface_hub client (in-process, 127.0.0.1)."""
import http.client
import subprocess
import sys
from pathlib import Path

import pytest

from runbook.lab.hub import HubServer, publish_repo

hf = pytest.importorskip("huggingface_hub")
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

REPO = "lab-org/tiny"


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    (src / "config.json").write_text('{"model_type": "tiny"}\n')
    (src / "sub").mkdir()
    (src / "sub" / "tok.txt").write_text("a b c\n")
    (src / "model.safetensors").write_bytes(bytes(range(256)) * 4096)   # 1 MiB, LFS
    root = tmp_path_factory.mktemp("hubroot")
    sha1 = publish_repo(root, REPO, src)
    (src / "config.json").write_text('{"model_type": "tiny", "v": 2}\n')
    sha2 = publish_repo(root, REPO, src)
    return root, src, sha1, sha2


@pytest.fixture()
def hub(published):
    with HubServer(published[0]) as server:
        yield server


def test_publish_pins_revisions_and_moves_main(published, hub):
    _root, _, sha1, sha2 = published
    assert sha1 != sha2 and len(sha1) == 40
    api = HfApi(endpoint=hub.url, token=False)
    assert api.model_info(REPO).sha == sha2
    old = api.model_info(REPO, revision=sha1, files_metadata=True)
    assert old.sha == sha1
    sizes = {s.rfilename: s.size for s in old.siblings}
    assert sizes == {"config.json": 23, "sub/tok.txt": 6, "model.safetensors": 1 << 20}
    lfs = {s.rfilename: s.lfs for s in old.siblings}
    assert lfs["config.json"] is None
    import hashlib
    assert lfs["model.safetensors"].sha256 == hashlib.sha256(bytes(range(256)) * 4096).hexdigest()


def test_tree_paths_info_and_errors(published, hub):
    _, _, sha1, _ = published
    api = HfApi(endpoint=hub.url, token=False)
    tree = {e.path: e for e in api.list_repo_tree(REPO, revision=sha1, recursive=True)}
    assert set(tree) == {"sub", "sub/tok.txt", "config.json", "model.safetensors"}
    info = api.get_paths_info(REPO, ["config.json", "sub", "nope"], revision=sha1)
    assert [i.path for i in info] == ["config.json", "sub"]
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="0" * 40)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("lab-org/absent")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "absent.bin", revision=sha1, endpoint=hub.url, token=False,
                        local_dir=str(published[0].parent / "x"))


def test_head_metadata_headers(published, hub):
    _, _, sha1, _ = published
    meta = get_hf_file_metadata(hf_hub_url(REPO, "model.safetensors", revision=sha1, endpoint=hub.url))
    assert meta.commit_hash == sha1 and meta.size == 1 << 20 and len(meta.etag) == 64
    small = get_hf_file_metadata(hf_hub_url(REPO, "config.json", revision="main", endpoint=hub.url))
    assert small.commit_hash == published[3] and len(small.etag) == 40   # git blob id


def _get(hub, path, headers=None):
    host, port = hub.httpd.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("GET", path, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp, body


def test_http_range(published, hub):
    _, _, sha1, _ = published
    path = f"/{REPO}/resolve/{sha1}/model.safetensors"
    data = bytes(range(256)) * 4096
    resp, body = _get(hub, path, {"Range": "bytes=10-19"})
    assert resp.status == 206 and body == data[10:20]
    assert resp.getheader("Content-Range") == f"bytes 10-19/{len(data)}"
    resp, body = _get(hub, path, {"Range": "bytes=-5"})
    assert resp.status == 206 and body == data[-5:]
    resp, body = _get(hub, path, {"Range": f"bytes={len(data)}-"})
    assert resp.status == 416
    resp, body = _get(hub, path)
    assert resp.status == 200 and body == data and resp.getheader("X-Linked-Size") == str(len(data))


def test_token_required_when_configured(published, tmp_path):
    with HubServer(published[0], token="lab-secret") as server:
        with pytest.raises(RepositoryNotFoundError):
            HfApi(endpoint=server.url, token=False).model_info(REPO)
        assert HfApi(endpoint=server.url, token="lab-secret").model_info(REPO).sha == published[3]


def test_lab_health_answers_with_no_repository_published_and_without_a_token(tmp_path):
    """control.ensure_hub's liveness probe: a rehearsal on a fresh machine publishes only the recipe's repo ids
    (no spark-runbook/tiny), and the probe must not need the token."""
    from runbook.lab import control
    from runbook.lab.hub import HEALTH_PATH
    with HubServer(tmp_path, token="lab-secret") as server:
        conn = http.client.HTTPConnection(server.url.split("//")[1], timeout=5)
        conn.request("GET", HEALTH_PATH)
        assert conn.getresponse().status == 200
        assert control.hub_alive(server.url)
    assert not control.hub_alive(server.url)             # stopped: nothing answers


def test_cli_serves(published):
    proc = subprocess.Popen([sys.executable, "-m", "runbook.lab.hub", "--root", str(published[0]),
                             "--host", "127.0.0.1", "--port", "0"], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        line = proc.stdout.readline()
        url = line.strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:")
        assert HfApi(endpoint=url, token=False).model_info(REPO).sha == published[3]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_engram_source_repo_is_served_like_the_real_checkpoint(tmp_path):
    """What a rehearsal needs to download an Engram source for real: a pinned V4.1-shaped repo
    (shards 47/48 as LFS files with sha256, index, config) plus files recipe A does not fetch."""
    from runbook.lab.hub import ENGRAM_OTHER_SHARD, publish_engram_source
    sha = publish_engram_source(tmp_path / "a", "lab-org/engram", vocab=600)
    assert sha == publish_engram_source(tmp_path / "b", "lab-org/engram", vocab=600)     # deterministic
    with HubServer(tmp_path / "a") as server:
        info = HfApi(endpoint=server.url, token=False).model_info("lab-org/engram", revision=sha, files_metadata=True)
    files = {s.rfilename: s for s in info.siblings}
    assert set(files) == {"config.json", "model.safetensors.index.json", "tokenizer.json", ENGRAM_OTHER_SHARD,
                          "model-00047-of-00048.safetensors", "model-00048-of-00048.safetensors"}
    assert files["model-00047-of-00048.safetensors"].lfs.sha256 and files["config.json"].lfs is None
    cli = subprocess.run([sys.executable, "-m", "runbook.lab.hub", "--root", str(tmp_path / "c"),
                          "--publish-engram", "lab-org/engram", "--engram-vocab", "600"],
                         capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert cli.returncode == 0 and cli.stdout.strip() == sha
