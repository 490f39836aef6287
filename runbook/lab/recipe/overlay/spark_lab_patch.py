"""The lab recipe's patch: every HTTP response of vLLM's API server carries ``X-Spark-Runbook-Recipe``.

Applied the way an overlay patches an installed package it may not write to (the lab's vLLM venv is
mounted read-only into the containers): ``sitecustomize`` calls :func:`install`, which puts an import
hook first on ``sys.meta_path``. When ``vllm.entrypoints.launchers.app`` is loaded, the hook wraps its
``build_app`` before any other module can bind the name, so every importer gets the wrapped function.

Fail-closed twice: ``start.sh`` runs :func:`check_target` before vLLM starts (the module file must exist
and define the function), and the hook raises ImportError if the loaded module lacks the function.

Standalone on purpose (standard library only): it runs in every Python process of a rank.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

PATCH_ID = "lab-recipe-v1"
HEADER = b"x-spark-runbook-recipe"
TARGET_MODULE = "vllm.entrypoints.launchers.app"
TARGET_FUNC = "build_app"
PREFIX = "[lab-recipe]"


def _say(msg: str) -> None:
    # stderr: some tools parse a child Python's stdout
    print(f"{PREFIX} {msg}", file=sys.stderr, flush=True)


def target_file() -> str | None:
    """Path of the target module's source in the installed vLLM, found without importing vLLM."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    return os.path.join(root, *TARGET_MODULE.split(".")[1:]) + ".py"


def check_target() -> int:
    """0 when the installed vLLM defines the patch target, else 1 with one FATAL line on stderr."""
    path = target_file()
    if path is None:
        _say("FATAL: patch target: no vllm package on this interpreter's path")
        return 1
    try:
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
    except OSError as exc:
        _say(f"FATAL: patch target {TARGET_MODULE} missing: {path}: {exc.strerror or exc}")
        return 1
    if f"def {TARGET_FUNC}(" not in source:
        _say(f"FATAL: patch target {TARGET_MODULE}.{TARGET_FUNC} missing: {path} does not define it")
        return 1
    print(f"{PREFIX} patch target: {path}:{TARGET_FUNC}", flush=True)
    return 0


class HeaderMiddleware:
    """Pure ASGI middleware: adds the recipe header to every HTTP response."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)

        async def send_with_header(message):
            if message.get("type") == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), (HEADER, PATCH_ID.encode())]
            await send(message)

        return await self.app(scope, receive, send_with_header)


def wrap_build_app(build_app):
    @functools.wraps(build_app)
    def build_app_with_recipe_header(*args, **kwargs):
        app = build_app(*args, **kwargs)
        if getattr(app, "middleware_stack", None) is None:
            app.add_middleware(HeaderMiddleware)
        else:                              # already built (vLLM's SageMaker bootstrap): wrap the outermost layer
            app.middleware_stack = HeaderMiddleware(app.middleware_stack)
        return app
    build_app_with_recipe_header.spark_lab_patch = PATCH_ID
    return build_app_with_recipe_header


def _patch(module) -> None:
    fn = getattr(module, TARGET_FUNC, None)
    if not callable(fn):
        raise ImportError(f"{PREFIX} FATAL: patch target {TARGET_MODULE}.{TARGET_FUNC} is missing "
                          f"(vLLM at {getattr(module, '__file__', '?')})")
    setattr(module, TARGET_FUNC, wrap_build_app(fn))
    _say(f"patched {TARGET_MODULE}.{TARGET_FUNC}: responses carry {HEADER.decode()}: {PATCH_ID}")


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _patch(module)

    def __getattr__(self, name):          # get_source, get_code, ... for tools that ask the loader
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None                    # not there: the normal import error follows
        spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Arm the hook once per process."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
    _say(f"overlay active: {PATCH_ID} armed for {TARGET_MODULE}.{TARGET_FUNC} "
         f"(pid {os.getpid()}, recipe {os.environ.get('SPARK_RUNBOOK_RECIPE_COMMIT', '?')[:12]})")
