"""Which on-disk layout a profile's weights use, derived from the profile (never from RECIPE).

* ``MODEL_DIR`` is a bare repo id (``org/name``, what recipe B passes to ``vllm serve`` with
  ``HF_HUB_OFFLINE=1``): ``hub_cache``. ``WEIGHTS_DIR`` is then ``HF_HOME`` (recipe B's ``HF_CACHE``,
  mounted at ``/cache/huggingface``) and the download goes to its hub cache ``WEIGHTS_DIR/hub``:
  ``models--org--name/{blobs,snapshots/<rev>,refs/main}``. What is copied or exported to a worker is
  that ``models--org--name`` folder only; the JIT caches recipe B keeps beside it under
  ``HF_HOME`` (``vllm-cache``, ``triton-cache``, …) stay node-local.
* Otherwise (``MODEL_DIR`` is a path inside the runtime, e.g. recipe A's ``/model``): ``local_dir``,
  a plain tree in ``WEIGHTS_DIR``, which is also what is shared.
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from ..errors import RunbookError
from . import node_download

REPO_ID = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
HUB_SUBDIR = "hub"          # HF_HUB_CACHE = HF_HOME/hub (huggingface_hub's default)


@dataclass(frozen=True)
class WeightsLayout:
    kind: str               # node_download.LAYOUTS
    repo: str
    revision: str

    def download_dir(self, root: str) -> str:
        """``--dest`` of the node download: ``root`` itself, or its hub cache ``root/hub``."""
        return root if self.kind == "local_dir" else posixpath.join(root, HUB_SUBDIR)

    def store(self, root: str) -> str:
        """What is copied/exported to a worker (and what CACHE_DIR must stay out of)."""
        return node_download.store_dir(self.kind, self.download_dir(root), self.repo)

    def tree(self, root: str) -> str:
        """The files under their repo paths: what is verified, where the manifest sits."""
        return node_download.tree_dir(self.kind, self.download_dir(root), self.repo, self.revision)

    @property
    def tree_in_store(self) -> str:
        """The tree relative to the store ("" for local_dir, ``snapshots/<rev>`` for hub_cache)."""
        rel = posixpath.relpath(self.tree("/r"), self.store("/r"))
        return "" if rel == "." else rel


def weights_layout(profile) -> WeightsLayout:
    """The layout of ``HF_MODEL_REPO`` on the nodes, from ``MODEL_DIR`` (see the module doc)."""
    model_dir = profile.model_dir
    if REPO_ID.match(model_dir or ""):
        if model_dir != profile.hf_model_repo:
            raise RunbookError("MODEL_DIR is a repo id other than HF_MODEL_REPO", observed=f"MODEL_DIR={model_dir}, "
                               f"HF_MODEL_REPO={profile.hf_model_repo}",
                               expected="vllm serve loads the repo the weights step downloads",
                               fix="set MODEL_DIR to HF_MODEL_REPO (served offline from the hub cache in "
                                   "WEIGHTS_DIR/hub) or to the path WEIGHTS_DIR is mounted at in the runtime")
        return WeightsLayout("hub_cache", profile.hf_model_repo, profile.hf_revision)
    return WeightsLayout("local_dir", profile.hf_model_repo, profile.hf_revision)
