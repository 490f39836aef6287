"""The software stack a rank will load, read before it starts (read-only commands and their pure parsers): the
python and vLLM build (version and a hash of its package tree), the NCCL library it loads, torch, the runtime
image's identity, the driver, and the recipe files a rank mounts from the node's checkout.

    text = node.read(probe_command(profile, python=..., env=...), timeout=PROBE_TIMEOUT).stdout
    stack = parse_stack(text)                   # {"python", "vllm": {...}, "nccl": {...}, "torch"} or {"error"}
    image = parse_image_identity(node.read(image_identity_cmd(profile.image)).stdout)
    recipe = parse_recipe_files(node.read(recipe_files_cmd(recipe_dir, files)).stdout)

Field reports behind it (docs/diagnose.md ``nccl-build-mismatch``, ``version-skew``): TP=2 hung 20-26 minutes
into load when the ranks loaded two different NCCL builds (vLLM #41725, #42354), and a worker with another vLLM
build or image joins the rendezvous and fails far from the cause. :mod:`runbook.launch.identity` compares them.
"""
from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass

__all__ = ["PROBE_SCRIPT", "PROBE_TIMEOUT", "ImageIdentity", "RecipeFiles", "image_identity_cmd",
           "parse_image_identity", "parse_recipe_files", "parse_stack", "probe_command", "recipe_files_cmd"]

PROBE_TIMEOUT = 180          # a cold page cache reads the vLLM package (~0.5-1 GB) from disk once
_MARK = "SPARK-RUNBOOK-STACK "

#: Runs with the rank's own python (stdlib only, python >= 3.8); prints one line: the marker, then JSON.
#:
#: The vLLM package tree hash: sha256 over the sorted lines ``relative path NUL size NUL sha256(content)`` of
#: every file under the installed ``vllm`` package dir (``__pycache__`` and ``*.pyc`` left out: the
#: interpreter writes those per node). Content, not mtimes: pip writes each file at install time, so two
#: installs of one wheel differ in mtime and agree in content, and a file patched in place on one node (an
#: image's overlay, a hand edit) keeps its size but not its content. Measured on the lab's CPU build
#: (5,942 files, 480 MB): 0.5 s with a warm page cache, 4 s cold, on this 2-core machine; sha256 has CPU
#: support on x86-64 and on the GB10's Arm cores. ``find_spec`` locates the package without importing it
#: (importing vLLM takes seconds and initialises torch).
#:
#: The NCCL library: the one vLLM's ``find_nccl_library`` ends up with. ``VLLM_NCCL_SO_PATH`` when the rank's
#: environment sets it; else vLLM opens ``libnccl.so.2``, which resolves to the library torch already loaded:
#: the pip ``nvidia-nccl-*`` wheel's when torch's metadata requires one (PyPI's CUDA torch), else the system's
#: (an NGC image's torch is built against it; ``ldconfig -p``). Its version comes from the ``NCCL version
#: X.Y.Z+cudaA.B`` string NCCL compiles into itself, its build from the sha256 of the file. No torch import.
PROBE_SCRIPT = r'''
import hashlib, importlib.util, json, os, re, subprocess, sys
try:
    import importlib.metadata as md
except ImportError:
    md = None
out = {"python": sys.executable, "python_version": sys.version.split()[0], "prefix": sys.prefix}

def sha_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

def tree(root):
    h, n, size = hashlib.sha256(), 0, 0
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for name in sorted(files):
            p = os.path.join(d, name)
            if name.endswith((".pyc", ".pyo")) or not os.path.isfile(p):
                continue
            s = os.path.getsize(p)
            h.update(("%s\0%d\0%s\n" % (os.path.relpath(p, root), s, sha_file(p))).encode())
            n, size = n + 1, size + s
    return h.hexdigest(), n, size

def dist_version(top):
    names = []
    try:
        names = list(md.packages_distributions().get(top, []))
    except Exception:
        pass
    for name in names + [top]:
        try:
            return name, md.version(name)
        except Exception:
            pass
    return "", ""

try:
    spec = importlib.util.find_spec("vllm")
except Exception as exc:
    spec, out["vllm_error"] = None, repr(exc)
if spec is not None and spec.submodule_search_locations:
    root = list(spec.submodule_search_locations)[0]
    name, version = dist_version("vllm")
    digest, n, size = tree(root)
    out["vllm"] = {"dist": name, "version": version, "dir": root, "tree_sha256": digest, "files": n, "bytes": size}
torch_dist, out["torch"] = dist_version("torch")

def nccl_library():
    if os.environ.get("VLLM_NCCL_SO_PATH"):
        return os.environ["VLLM_NCCL_SO_PATH"], "VLLM_NCCL_SO_PATH", ""
    reqs = []
    try:
        reqs = md.requires(torch_dist or "torch") or []
    except Exception:
        pass
    pip = [re.split(r"[ ;<>=!~\[]", r, 1)[0] for r in reqs if r.lower().startswith("nvidia-nccl")]
    if pip:
        try:
            for loc in importlib.util.find_spec("nvidia.nccl").submodule_search_locations or []:
                lib = os.path.join(loc, "lib", "libnccl.so.2")
                if os.path.exists(lib):
                    try:
                        return lib, "pip " + pip[0], md.version(pip[0])
                    except Exception:
                        return lib, "pip " + pip[0], ""
        except Exception:
            pass
    for ldconfig in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            text = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=20).stdout
        except Exception:
            continue
        m = re.search(r"libnccl\.so\.2 \([^)]*\) => (\S+)", text)
        if m:
            return m.group(1), "system (ldconfig)", ""
        break
    return "", "", ""

lib, via, pip_version = nccl_library()
if lib and os.path.exists(lib):
    import mmap
    with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        m = re.search(rb"NCCL version (\d+\.\d+\.\d+[\w.+-]*)", data)
        build = sha_file(lib)
    real = os.path.realpath(lib)
    name_version = re.search(r"\.so\.(\d+\.\d+\.\d+)$", real)
    out["nccl"] = {"path": lib, "real": real, "via": via, "pip_version": pip_version,
                   "version": m.group(1).decode() if m else (name_version.group(1) if name_version else ""),
                   "sha256": build}
elif lib:
    out["nccl"] = {"path": lib, "via": via, "missing": True}
else:
    out["nccl"] = {}
print("SPARK-RUNBOOK-STACK " + json.dumps(out, sort_keys=True))
'''

#: the environment keys of a rank that decide which vLLM and which NCCL its python finds
PROBE_ENV_KEYS = ("PYTHONPATH", "LD_LIBRARY_PATH", "VLLM_NCCL_SO_PATH")


def probe_command(*, python: str = "", image: str = "", env: dict[str, str] | None = None) -> str:
    """The probe as the rank would run it: with ``python`` on the node (the process runtime), else inside
    ``image`` in a throw-away container with no network (the docker runtime), with the rank's library-path
    environment. Without an explicit python the interpreter of the ``vllm`` command's shebang is used
    (``python3`` when there is none)."""
    keep = {k: v for k, v in (env or {}).items() if k in PROBE_ENV_KEYS and v}
    if image:
        # the interpreter the image's `vllm` entry point names; the script is sh's $0, so nothing is quoted twice
        inner = ('py=$(sed -n "1s/^#! *//p" "$(command -v vllm 2>/dev/null)" 2>/dev/null | cut -d" " -f1); '
                 'exec "${py:-python3}" -c "$0"')
        envs = " ".join(f"-e {shlex.quote(f'{k}={v}')}" for k, v in sorted(keep.items()))
        return (f"docker run --rm --network none {envs + ' ' if envs else ''}--entrypoint sh "
                f"{shlex.quote(image)} -c {shlex.quote(inner)} {shlex.quote(PROBE_SCRIPT)} 2>&1")
    prefix = ("env " + " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(keep.items())) + " ") if keep else ""
    if python:
        return f"{prefix}{shlex.quote(python)} -c {shlex.quote(PROBE_SCRIPT)} 2>&1"
    return (f'py=$(sed -n "1s/^#! *//p" "$(command -v vllm 2>/dev/null)" 2>/dev/null | cut -d" " -f1); '
            f'{prefix}"${{py:-python3}}" -c {shlex.quote(PROBE_SCRIPT)} 2>&1')


def parse_stack(text: str) -> dict:
    """The probe's JSON line (the last one with the marker); ``{"error": <output tail>}`` when the probe
    printed none (no python, the image could not run, a timeout)::

        SPARK-RUNBOOK-STACK {"python": "/v/bin/python", "python_version": "3.11.7", "torch": "2.13.0+cpu",
          "vllm": {"version": "0.32.0", "tree_sha256": "93ea…", "files": 5942, ...}, "nccl": {}}
    """
    for line in reversed((text or "").splitlines()):
        if line.startswith(_MARK):
            try:
                value = json.loads(line[len(_MARK):])
            except ValueError:
                break
            if isinstance(value, dict):
                return value
            break
    tail = " | ".join(l.strip() for l in (text or "").strip().splitlines()[-3:])
    return {"error": tail[:300] or "no output"}


def image_identity_cmd(image: str) -> str:
    """The image as this node's docker has it: id, repo digests and the layer chain, on one line."""
    return (f"docker image inspect --format '{{{{.Id}}}}|{{{{json .RepoDigests}}}}|{{{{json .RootFS.Layers}}}}' "
            f"{shlex.quote(image)} 2>&1")


@dataclass(frozen=True)
class ImageIdentity:
    image_id: str                 # "" when the node has no such image
    repo_digests: tuple[str, ...]
    layers_sha256: str            # sha256 over the layer digests in order: equal layers, equal image
    error: str = ""


def parse_image_identity(text: str) -> ImageIdentity:
    """:func:`image_identity_cmd`'s line::

        sha256:4c2e…|["ghcr.io/anemll/dspark-vllm-gx10@sha256:a839…"]|["sha256:1a2b…","sha256:3c4d…"]
    """
    line = next((l for l in (text or "").splitlines() if l.startswith("sha256:") and l.count("|") >= 2), "")
    if not line:
        return ImageIdentity("", (), "", error=(text or "").strip()[-200:] or "no output")
    image_id, digests, layers = line.split("|", 2)
    try:
        repo = tuple(json.loads(digests) or ())
        chain = [str(x) for x in json.loads(layers) or ()]
    except ValueError:
        return ImageIdentity(image_id, (), "", error=f"unreadable inspect output: {line[:200]}")
    return ImageIdentity(image_id, repo, hashlib.sha256("\n".join(chain).encode()).hexdigest() if chain else "")


def recipe_files_cmd(recipe_dir: str, files: list[str]) -> str:
    """The checkout's commit, then one ``sha256  path`` line per file under the paths the ranks mount or run
    (directories walked, paths relative to the checkout so every node prints the same names)."""
    paths = " ".join(shlex.quote(f) for f in files) or "."
    return (f"cd {shlex.quote(recipe_dir)} 2>/dev/null || {{ echo 'no checkout'; exit 0; }}; "
            "echo \"commit $(git rev-parse HEAD 2>/dev/null || cat .recipe-commit 2>/dev/null)\"; "
            f"find {paths} -type f ! -name '*.pyc' -print0 2>/dev/null | LC_ALL=C sort -z | "
            "xargs -0 -r sha256sum 2>/dev/null")


@dataclass(frozen=True)
class RecipeFiles:
    commit: str
    files: int
    files_sha256: str             # sha256 over the ``sha256  path`` lines: the same files, the same content
    error: str = ""


def parse_recipe_files(text: str) -> RecipeFiles:
    """:func:`recipe_files_cmd`'s output::

        commit 2f0c1d…
        9b1c…  overlay/exl3.py
        0e4d…  start.sh
    """
    lines = (text or "").splitlines()
    if not lines or lines[0].strip() == "no checkout":
        return RecipeFiles("", 0, "", error="no checkout at RECIPE_DIR")
    commit = lines[0].split(" ", 1)[1].strip() if lines[0].startswith("commit") and " " in lines[0] else ""
    sums = [l.strip() for l in lines[1:] if re.match(r"^[0-9a-f]{64}  \S", l.strip())]
    return RecipeFiles(commit, len(sums), hashlib.sha256("\n".join(sums).encode()).hexdigest() if sums else "")
