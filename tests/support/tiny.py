"""The lab's tiny model on every node of a cluster: what the lab tests that start their own server need first."""
from __future__ import annotations

import subprocess
from pathlib import Path

from runbook.profile import REPO_ROOT
from runbook.remote import quote

LAB_VENV = REPO_ROOT / ".lab" / "vllm-venv"
TINY_MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                    "tokenizer_config.json", "chat_template.jinja")


def tiny_model_on(cluster, model_dir: str, scratch: Path) -> str:
    """``model_dir`` on every node holds the tiny model (node-private /mnt/nvme): made once in ``scratch`` with the
    lab venv's python and put on the nodes that lack a file of it. Returns ``model_dir``."""
    missing = [n for n in cluster
               if not n.read(" && ".join(f"test -s {model_dir}/{f}" for f in TINY_MODEL_FILES)).ok]
    if missing:
        out = scratch / "tiny"
        subprocess.run([str(LAB_VENV / "bin" / "python"), "-m", "runbook.lab.tinymodel", "--out", str(out)],
                       cwd=REPO_ROOT, check=True, capture_output=True, timeout=300)
        for node in missing:
            node.run(f"mkdir -p {quote(model_dir)}")
            for f in TINY_MODEL_FILES:
                node.put(out / f, f"{model_dir}/{f}")
    return model_dir
