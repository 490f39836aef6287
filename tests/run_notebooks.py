"""Execute the step notebooks with nbmake (``pytest --nbmake``) against the shipped fakes, without nodes.

    python tests/run_notebooks.py            # make check runs this; exit code = pytest's

What runs, and against what (each notebook exactly as shipped, its parameters cell overridden the way the
runner overrides it, papermill's ``parameterize_notebook``):
- ``05_smoke`` and ``06_vision_tools``: the lab profile against the fake vLLM (``support.fake_vllm``, served
  over HTTP) through their ``base_url`` parameter: every request goes through the openai SDK and the fake
  refuses what it does not model; ``step.finish()`` raises on any FAIL row, so the notebook fails.
- ``07_bench``: the lab profile against the reference server (``runbook.bench.refserver``, the fake whose
  timing truth is known), one repeat, no soak, no ``vllm bench serve`` cross-check (no vLLM here).
- ``08_report``: a captured run folder in the real formats (``support.runs.build_full_run``, every step 00-07).
- ``00``-``04`` are not run here: each reads facts from the nodes over SSH even in a dry run, so they need
  the lab (``make test`` runs all nine with papermill in tests/lab/test_full_runbook.py).
Everything is written to a temporary folder (removed after a pass); nothing lands in results/.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import nbformat  # noqa: E402
from papermill.iorw import load_notebook_node  # noqa: E402
from papermill.parameterize import parameterize_notebook  # noqa: E402

import runbook.step  # noqa: E402
from runbook.bench.refserver import RefConfig, serve_in_thread  # noqa: E402
from support.fake_vllm import FakeVllm, serve_http  # noqa: E402
from support.runs import build_full_run, recipe_profile, seed_bench_output  # noqa: E402

PROFILE = "env/lab.env"


def write(src: str, out: Path, **params) -> None:
    """``notebooks/<src>.ipynb`` with ``params`` injected after its parameters cell, into ``out``. A name the
    parameters cell does not define is refused (papermill would inject it silently and change nothing)."""
    nb = load_notebook_node(str(ROOT / "notebooks" / f"{src}.ipynb"))
    declared = next(c.source for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    unknown = [name for name in params if not re.search(rf"^{name}\s*=", declared, re.M)]
    if unknown:
        raise SystemExit(f"{src}: no parameter {unknown} in its parameters cell")
    nb = parameterize_notebook(nb, params)
    nbformat.write(nb, out / f"{src}.ipynb")


def main(argv: list[str]) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="runbook-nbmake-"))
    books = tmp / "notebooks"
    books.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "HF_TOKEN")}
    env["RUNBOOK_SECRETS_FILE"] = str(tmp / "no-secrets.env")     # this user's secrets never reach a fake
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    os.environ["RUNBOOK_SECRETS_FILE"] = env["RUNBOOK_SECRETS_FILE"]

    # one run folder for 05-07, as the runner gives them
    run = runbook.step.begin("05_smoke", PROFILE, results_root=tmp / "results").run.path
    profile = recipe_profile(PROFILE)
    captured = build_full_run(tmp / "captured", "20261201-040000-lab", profile,
                              bench=seed_bench_output(tmp / "bench", profile), recipe=False)

    ref = RefConfig(model=profile.served_model_name, ttft_s=0.005, interval_s=0.001, prefill_tok_s=1e7,
                    max_model_len=profile.max_model_len)
    with serve_http(FakeVllm(model=profile.served_model_name, max_model_len=profile.max_model_len)) as fake_url, \
            serve_in_thread(ref) as refsrv:
        common = {"profile_path": PROFILE, "run_dir": str(run)}
        write("05_smoke", books, **common, base_url=fake_url)
        write("06_vision_tools", books, **common, base_url=fake_url)
        write("07_bench", books, **common, base_url=refsrv.base_url, repeats=1, soak_seconds=0,
              vllm_cross_check=False)
        write("08_report", books, profile_path=PROFILE, run_dir=str(captured), results_root=str(captured.parent))
        cmd = [sys.executable, "-m", "pytest", "--nbmake", "--nbmake-timeout=300", "-p", "no:cacheprovider",
               "-q", "--rootdir", str(books), *argv, str(books)]
        print(f"notebooks against fakes in {tmp}: {' '.join(cmd)}", flush=True)
        rc = subprocess.run(cmd, env=env, cwd=books, timeout=900).returncode
    if rc == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    else:                                   # kept: the executed notebooks and the run folders say what failed
        print(f"kept for inspection: {tmp}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
