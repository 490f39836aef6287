"""The diagnose archive: write a bundle's texts (masked) with the matched findings and their pages, and read
one back. Kept apart from ``bundle.py`` (what is collected) so that matching can import the bundle types
without a cycle."""
from __future__ import annotations

import datetime as _dt
import io
import json
import tarfile
from pathlib import Path
from typing import Mapping

from ..evidence import atomic_write
from ..secrets import Redactor
from .inputs import Budget, read_archive, read_folder
from .bundle import MAX_TEXT_BYTES, TIMING_KEYS, Bundle, Context, NAME_RE
from .match import match, render_html, render_markdown


def check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name) or ".." in name:
        raise ValueError(f"bundle {kind} name {name!r} is not a plain file name "
                         f"(fix: use letters, digits, '.', '_' or '-', no '/' and no '..')")


def _stamp(now: _dt.datetime | None) -> str:
    return (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")


def page_paths(archive: Path) -> tuple[Path, Path]:
    """The markdown and HTML pages written beside an archive."""
    base = str(archive)[: -len(".tar.gz")]
    return Path(base + ".md"), Path(base + ".html")


def write_bundle(run_dir: str | Path, texts: Mapping[str, Mapping[str, str]], redactor: Redactor, *,
                 context: Context | None = None, timings: Mapping[str, float] | None = None,
                 now: _dt.datetime | None = None) -> Path:
    """Mask secrets in every text, match the catalogue, write the archive and the pages.

    Layout inside the archive: ``<node>/<name>`` per text, ``context.json``, ``timings.json``,
    ``findings.json``, ``diagnose.md``. Raises ValueError on a node or text name that is not a plain
    file name, before anything is written.
    """

    if not isinstance(redactor, Redactor):
        raise TypeError("write_bundle needs a runbook.secrets.Redactor (fix: pass runbook.secrets.default_redactor())")
    for node, items in texts.items():
        check_name("node", node)
        for name in items:
            check_name(f"text (node {node})", name)
    unknown = set(timings or {}) - set(TIMING_KEYS)
    if unknown:
        raise ValueError(f"unknown timing key(s) {sorted(unknown)} (known: {sorted(TIMING_KEYS)})")
    clean: dict[str, dict[str, str]] = {}
    for node, items in texts.items():
        clean[node] = {}
        for name, text in items.items():
            text = text if isinstance(text, str) else ("" if text is None else str(text))
            raw = text.encode("utf-8", "replace")
            if len(raw) > MAX_TEXT_BYTES:     # keep the end: the failure is usually last
                text = "(cut to the last 8 MiB)\n" + raw[-MAX_TEXT_BYTES:].decode("utf-8", "replace")
            clean[node][name] = redactor.redact(text)
    bundle = Bundle(texts=clean, context=context or Context(), timings=dict(timings or {}))
    findings = match(bundle)
    stamp = _stamp(now)
    md = redactor.redact(render_markdown(findings, bundle, title=f"diagnose {stamp}"))
    page = redactor.redact(render_html(findings, bundle, title=f"diagnose {stamp}"))
    members: dict[str, bytes] = {}
    for node, items in clean.items():
        for name, text in items.items():
            members[f"{node}/{name}"] = text.encode("utf-8")
    members["context.json"] = redactor.redact(json.dumps(bundle.context.to_dict(), indent=2)).encode()
    members["timings.json"] = json.dumps(bundle.timings, indent=2).encode()
    members["findings.json"] = redactor.redact(json.dumps([f.to_dict() for f in findings], indent=2)).encode()
    members["diagnose.md"] = md.encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        mtime = int((now or _dt.datetime.now()).timestamp())
        for name, data in members.items():
            info = tarfile.TarInfo(f"diagnose-{stamp}/{name}")
            info.size, info.mtime, info.mode = len(data), mtime, 0o600
            tar.addfile(info, io.BytesIO(data))
    out_dir = Path(run_dir) / "diagnose"
    archive = out_dir / f"diagnose-{stamp}.tar.gz"
    atomic_write(archive, buf.getvalue(), mode=0o600)
    md_path, html_path = page_paths(archive)
    atomic_write(md_path, md)
    atomic_write(html_path, page)
    return archive


OWN_BUNDLE_BYTES = 1 << 30       # a bundle collect wrote: texts of 8 MiB at most, a few dozen per node


def read_bundle(path: str | Path, budget: Budget | None = None) -> Bundle:
    """A :class:`Bundle` from an archive written by :func:`write_bundle` or from a directory laid
    out like one (``<node>/<name>`` files, optional ``context.json`` / ``timings.json``). Read within ``budget``
    (:mod:`.inputs`: regular text files only, size-capped; :class:`~.inputs.InputError` otherwise). Without one,
    the bundle is the runbook's own (``collect``): up to 8 MiB per text, so a wider cap than a user's inputs get."""
    path = Path(path)
    budget = budget or Budget(left=OWN_BUNDLE_BYTES)
    if path.is_dir():
        files = read_folder(path, budget)
    elif path.exists():
        files = {(n.split("/", 1)[1] if "/" in n else n): t for n, t in read_archive(path, budget).items()}
    else:
        raise FileNotFoundError(f"no bundle at {path} (fix: pass a diagnose-*.tar.gz or a directory)")
    ctx = Context.from_dict(json.loads(files.pop("context.json"))) if "context.json" in files else Context()
    timings = json.loads(files.pop("timings.json")) if "timings.json" in files else {}
    texts: dict[str, dict[str, str]] = {}
    for rel, text in files.items():
        if "/" not in rel:
            continue                                # findings.json, diagnose.md, SOURCE.md
        node, name = rel.split("/", 1)
        if "/" in name:
            continue
        texts.setdefault(node, {})[name] = text
    return Bundle(texts=texts, context=ctx, timings={k: float(v) for k, v in timings.items()})
