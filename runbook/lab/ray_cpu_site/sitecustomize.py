"""LAB ONLY (spark_runbook_lab_ray_cpu.py says what and why): Python imports this at start-up in every process that
has runbook/lab/ray_cpu_site first on PYTHONPATH (the lab's Ray actors: spark_runbook_lab_ray_cpu.runtime_env_hook).
It arms the hook, then runs the next ``sitecustomize`` on the path (the lab recipe overlay's), which it shadows."""
import importlib.util
import os
import sys

import spark_runbook_lab_ray_cpu

spark_runbook_lab_ray_cpu.install()


def _chain() -> None:
    for d in sys.path:
        if not d or os.path.abspath(d) == spark_runbook_lab_ray_cpu.HERE:
            continue
        f = os.path.join(d, "sitecustomize.py")
        if os.path.isfile(f):
            spec = importlib.util.spec_from_file_location("_spark_runbook_next_sitecustomize", f)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return


_chain()
