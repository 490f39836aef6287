"""runbook.lab.tinymodel: importable without torch; with the lab venv, deterministic and well formed.

The model-making tests run `python -m runbook.lab.tinymodel` with the lab venv's python (torch,
transformers and tokenizers live there) and are skipped when that venv is absent. Set LAB_VLLM_VENV
to use a venv other than <repo>/.lab/vllm-venv.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAB_VENV = Path(os.environ.get("LAB_VLLM_VENV", REPO / ".lab" / "vllm-venv"))
LAB_PY = LAB_VENV / "bin" / "python"


def test_module_imports_without_torch():
    # The module must be importable from the project venv: heavy imports stay inside functions.
    code = (
        "import sys; import runbook.lab.tinymodel as t; "
        "bad = [m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules]; "
        "assert not bad, bad; print(t.ARCHS)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "llama" in out.stdout


def test_constants():
    from runbook.lab import tinymodel as t

    assert t.VOCAB_SIZE == 2048
    assert t.SPECIAL_TOKENS[0] == "<|endoftext|>"
    assert {"<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"} <= set(
        t.SPECIAL_TOKENS
    )
    assert (
        t.TEXT_DIMS["head_dim"] * t.TEXT_DIMS["num_attention_heads"]
        == t.TEXT_DIMS["hidden_size"]
    )


def test_cli_rejects_unknown_arch():
    from runbook.lab import tinymodel as t

    with pytest.raises(SystemExit):
        t.main(["--out", "/nonexistent", "--arch", "gpt9"])


def needs_lab(fn):
    """Needs the lab venv (torch/transformers); marked `vllm` (and `slow`) like the other lab-venv tests."""
    skip = pytest.mark.skipif(
        not LAB_PY.exists(),
        reason=f"lab vLLM venv absent ({LAB_PY}); run runbook/lab/install_vllm.sh",
    )
    return pytest.mark.slow(pytest.mark.vllm(skip(fn)))


def _make(out: Path, *args: str) -> None:
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    res = subprocess.run(
        [str(LAB_PY), "-m", "runbook.lab.tinymodel", "--out", str(out), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-4000:]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    if not LAB_PY.exists():
        pytest.skip(f"lab vLLM venv absent ({LAB_PY})")
    root = tmp_path_factory.mktemp("tiny")
    _make(root / "a")
    _make(root / "b")
    _make(root / "c", "--seed", "1", "--no-rig")
    return root


@needs_lab
def test_same_seed_is_byte_identical(made):
    assert _sha(made / "a" / "model.safetensors") == _sha(
        made / "b" / "model.safetensors"
    )
    assert _sha(made / "a" / "tokenizer.json") == _sha(made / "b" / "tokenizer.json")


@needs_lab
def test_other_seed_differs(made):
    assert _sha(made / "a" / "model.safetensors") != _sha(
        made / "c" / "model.safetensors"
    )


@needs_lab
def test_files_and_config(made):
    d = made / "a"
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
    ):
        assert (d / name).is_file(), name
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]) == (
        256,
        512,
        2,
    )
    assert (
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
    ) == (4, 2, 64)
    assert cfg["max_position_embeddings"] == 4096
    assert cfg["vocab_size"] == 2048
    assert "random" in (d / "README.md").read_text().lower()
    gen = json.loads((d / "generation_config.json").read_text())
    tok = json.loads((d / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert gen["eos_token_id"] == [ids["<|im_end|>"], ids["<|endoftext|>"]]
    assert (d / "model.safetensors").stat().st_size < 12_000_000


_PROBE = r"""
import json, sys
from safetensors.torch import load_file
from transformers import AutoTokenizer

def probe(d):
  tok = AutoTokenizer.from_pretrained(d)
  w = load_file(d + "/model.safetensors")
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
              "<tool_response>", "</tool_response>"]
  single = {s: tok.encode(s, add_special_tokens=False) for s in specials}
  tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
  msgs = [{"role": "user", "content": "hi"},
          {"role": "assistant", "content": None, "tool_calls": [
              {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
          {"role": "tool", "content": "sunny"}]
  text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
  col = w["lm_head.weight"][:, 0]
  quote = tok.convert_tokens_to_ids(tok.tokenize('"')[0])
  space = tok.encode(" ", add_special_tokens=False)[0]
  return {
      "single": {s: len(v) for s, v in single.items()},
      "template": text,
      "emb_col0": sorted(set(w["model.embed_tokens.weight"][:, 0].tolist())),
      "o_proj_row0": float(w["model.layers.0.self_attn.o_proj.weight"][0].abs().max()),
      "down_row0": float(w["model.layers.1.mlp.down_proj.weight"][0].abs().max()),
      "quote_bias": float(col[quote]), "space_bias": float(col[space]),
      "n_neg": int((col < 0).sum()), "n_pos": int((col > 0).sum()),
  }
print(json.dumps({d: probe(d) for d in sys.argv[1:]}))
"""


@pytest.fixture(scope="module")
def probed(made) -> dict:
    """Facts about models a and c, read in one lab-venv process (loading transformers is slow)."""
    dirs = [str(made / "a"), str(made / "c")]
    res = subprocess.run(
        [str(LAB_PY), "-c", _PROBE, *dirs],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    return {"a": out[dirs[0]], "c": out[dirs[1]]}


@needs_lab
def test_tokenizer_and_template(probed):
    p = probed["a"]
    assert set(p["single"].values()) == {1}, p[
        "single"
    ]  # every special token is one token
    t = p["template"]
    assert (
        t.startswith("<|im_start|>system\n") and "<tools>" in t and '"get_weather"' in t
    )
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
        in t
    )
    assert "<tool_response>\nsunny\n</tool_response>" in t
    assert t.endswith("<|im_start|>assistant\n")


@needs_lab
def test_rig_applied(probed):
    p = probed["a"]
    assert p["emb_col0"] == [1.0]
    assert p["o_proj_row0"] == 0.0 and p["down_row0"] == 0.0
    assert p["space_bias"] < 0 < p["quote_bias"]
    assert p["n_neg"] > 30 and p["n_pos"] > 5


@needs_lab
def test_no_rig_is_plain(probed):
    p = probed["c"]
    assert p["emb_col0"] != [1.0]
    assert p["o_proj_row0"] > 0.0


@needs_lab
def test_llava_variant(tmp_path):
    _make(tmp_path / "llava", "--arch", "llava")
    d = tmp_path / "llava"
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["LlavaForConditionalGeneration"]
    assert (
        cfg["text_config"]["hidden_size"] == 256
        and cfg["vision_config"]["image_size"] == 56
    )
    proc = json.loads((d / "processor_config.json").read_text())
    assert (
        proc["processor_class"] == "LlavaProcessor" and proc["image_token"] == "<image>"
    )
    header_len = int.from_bytes((d / "model.safetensors").read_bytes()[:8], "little")
    names = json.loads((d / "model.safetensors").read_bytes()[8 : 8 + header_len])
    vision = [n for n in names if n.startswith("vision_tower.")]
    assert vision and all(
        n.startswith("vision_tower.vision_model.") for n in vision
    )  # the layout vLLM loads
    assert any(n.startswith("multi_modal_projector.") for n in names)
    assert "<image>" in (d / "chat_template.jinja").read_text()
