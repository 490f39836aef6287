"""The run verdict: ``validated`` or ``candidate``, computed from the run folder alone.

A run is ``validated`` only when every requirement below is met; otherwise it is a ``candidate`` and each
unmet requirement gives one reason (``"<requirement>: <what is missing>"``). Anything the run folder does
not record counts as missing, never as met.

==================  ==========================================================================================
hardware            ``LAB`` is 0 in ``profile.json`` (not the embedded lab, not a ``REHEARSAL``)
image               ``RUNTIME=docker`` and ``IMAGE`` pinned by ``@sha256:<digest>``, or every node's image id
                    (00 sidecar ``data.nodes.<node>.image_id``) a ``sha256:`` digest, the same on every node
model revision      the revision 02 fetched (``data.revision``, else ``HF_REVISION``) is a 40-hex commit
Engram revision     ``ENGRAM=0``, or the Engram source's revision (02 ``data.engram.revision``, else
                    ``HF_ENGRAM_REVISION``) is a 40-hex commit
recipe checkout     04 ``data.recipe`` = ``{"commit", "markers": {node: [found lines]}}``: the commit is the
                    profile's ``RECIPE_COMMIT`` (40 hex) and every rank's node found its patch markers
smoke               05 sidecar passed, no check FAIL or SIMULATED
quality gate        05 checks named ``quality.*`` exist and each is PASS (or WARN)
tools               06 checks named ``tools.*`` exist and each is PASS (or WARN)
bench               the result the 07 sidecar names was measured under its seed's published conditions:
                    config ``conditions.published`` present, chat endpoint, temperature 0, thinking off,
                    the seed's workload and sizes; result not FAIL, at least one decode case
==================  ==========================================================================================
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from ..records import PreflightRecord, WeightsRecord
from .model import CANDIDATE, VALIDATED, ReportModel, Verdict
from .recompute_bench import find_bench_result
from .runfiles import find_sidecar, number, record_of

__all__ = ["run_verdict", "REQUIREMENTS"]

COMMIT = re.compile(r"[0-9a-f]{40}")
IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# statuses that do not show a requirement was met (SIMULATED: a simulator stood in for the hardware)
NOT_RUN = ("N/A", "SIMULATED")
FAILED = ("FAIL", "SIMULATED")

Sidecars = dict[str, dict[str, Any]]
Outcome = tuple[bool, str]          # (met, the evidence or what is missing)


def run_verdict(model: ReportModel, run: Path, sidecars: Sidecars) -> Verdict:
    """Every requirement of :data:`REQUIREMENTS`, in order; ``validated`` only when all are met."""
    missing, met = [], []
    for label, requirement in REQUIREMENTS:
        ok, text = requirement(model, run, sidecars)
        (met if ok else missing).append(f"{label}: {text}")
    return Verdict(verdict=VALIDATED if not missing else CANDIDATE, missing=missing, met=met)


def _flag(v: Any) -> bool | None:
    """A profile boolean as profile.json stores it (true/false; "1"/"0" from older runs); None if absent."""
    if isinstance(v, bool):
        return v
    if v is None:
        return None
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def _rank_nodes(model: ReportModel) -> list[str]:
    return [str(r.get("node")) for r in model.launch.get("ranks", []) if r.get("node")]


def hardware(model: ReportModel, run: Path, sidecars: Sidecars) -> Outcome:
    p = model.profile
    lab, rehearsal = _flag(p.get("LAB")), _flag(p.get("REHEARSAL"))
    if lab is None:
        return False, "profile.json has no LAB key (a lab run cannot be told from a run on the Sparks)"
    if rehearsal:
        return False, f"REHEARSAL=1: RECIPE={p.get('RECIPE')} rehearsed on the embedded lab, not run on the Sparks"
    if lab:
        return False, f"LAB=1: the embedded lab (RECIPE={p.get('RECIPE')}), not the Sparks"
    return True, "LAB=0"


def image(model: ReportModel, run: Path, sidecars: Sidecars) -> Outcome:
    runtime, ref = model.profile.get("RUNTIME"), str(model.profile.get("IMAGE") or "")
    if runtime != "docker":
        return False, (f"RUNTIME={runtime}: the server runs as a bare process, from no image pinned by digest"
                       if runtime else "profile.json has no RUNTIME")
    if re.search(r"@" + IMAGE_DIGEST.pattern + r"$", ref):
        return True, f"IMAGE={ref} is pinned by digest"
    rec = record_of(sidecars, PreflightRecord)
    _, pre = find_sidecar(sidecars, "preflight")      # a run made before records: the sidecar's data
    facts = ({n: {"image_id": f.image_id} for n, f in rec.nodes.items()} if rec is not None
             else ((pre or {}).get("data") or {}).get("nodes") or {})
    nodes = sorted(set(facts) | set(_rank_nodes(model)))
    tag = f"IMAGE={ref or '(empty)'} has no @sha256:<digest>"
    if not nodes:
        return False, f"{tag} and no node's image id is recorded (no 00_preflight node facts)"
    ids = {n: str((facts.get(n) or {}).get("image_id") or "") for n in nodes}
    absent = [n for n, i in ids.items() if not IMAGE_DIGEST.fullmatch(i)]
    if absent:
        return False, f"{tag} and 00_preflight recorded no image id on {', '.join(absent)}"
    if len(set(ids.values())) > 1:
        return False, f"{tag} and the nodes hold different images: " + ", ".join(
            f"{n}={i[:19]}…" for n, i in ids.items())
    return True, f"{ref}: image id {next(iter(ids.values()))[:19]}… on {', '.join(nodes)}"


def _revision(recorded: Any, key: str, configured: Any, where: str) -> Outcome:
    """The revision a step recorded (else the profile's ``key``): a 40-hex commit, equal to the profile's."""
    rev = str(recorded or configured or "")
    src = where if recorded else key
    if not rev:
        return False, f"none recorded ({key} empty, no revision in {where})"
    if recorded and configured and str(recorded) != str(configured):
        return False, f"{where} fetched {recorded}, {key}={configured}"
    if not COMMIT.fullmatch(rev):
        return False, f"{src} {rev!r} is not a 40-hex commit"
    return True, rev


def model_revision(model: ReportModel, run: Path, sidecars: Sidecars) -> Outcome:
    name, sc = find_sidecar(sidecars, "weights")
    rec = record_of(sidecars, WeightsRecord)
    revision = rec.revision if rec is not None else ((sc or {}).get("data") or {}).get("revision")
    return _revision(revision, "HF_REVISION", model.profile.get("HF_REVISION"), f"steps/{name or '02_weights'}.json")


def engram_revision(model: ReportModel, run: Path, sidecars: Sidecars) -> Outcome:
    on = _flag(model.profile.get("ENGRAM"))
    if on is None:
        return False, "profile.json has no ENGRAM key"
    if not on:
        return True, "ENGRAM=0 (no Engram tables)"
    name, sc = find_sidecar(sidecars, "weights")
    rec = record_of(sidecars, WeightsRecord)
    source = ({"revision": rec.engram.revision if rec.engram else ""} if rec is not None
              else ((sc or {}).get("data") or {}).get("engram") or {})
    return _revision(source.get("revision"), "HF_ENGRAM_REVISION", model.profile.get("HF_ENGRAM_REVISION"),
                     f"steps/{name or '02_weights'}.json data.engram")


def recipe_checkout(model: ReportModel, run: Path, sidecars: Sidecars) -> Outcome:
    name, sc = find_sidecar(sidecars, "launch")
    if sc is None:
        return False, "step 04 did not run (no launch sidecar)"
    rec = (sc.get("data") or {}).get("recipe")
    if not isinstance(rec, dict):
        return False, (f"not recorded (steps/{name}.json has no data.recipe with the checkout's commit and the "
                       "patch markers found on each rank)")
    problems = []
    commit, pinned = str(rec.get("commit") or ""), str(model.profile.get("RECIPE_COMMIT") or "")
    if not COMMIT.fullmatch(commit):
        problems.append(f"commit {commit!r} is not a 40-hex commit")
    if not pinned:
        problems.append("RECIPE_COMMIT is empty (nothing pins the checkout)")
    elif commit != pinned:
        problems.append(f"checkout at {commit[:12] or '?'}, RECIPE_COMMIT pins {pinned[:12]}")
    markers = rec.get("markers") if isinstance(rec.get("markers"), dict) else {}
    nodes = _rank_nodes(model) or sorted(markers)
    bare = [n for n in nodes if not (isinstance(markers.get(n), list) and markers[n])]
    if not nodes:
        problems.append("no rank recorded")
    elif bare:
        problems.append(f"no patch marker found on {', '.join(bare)}")
    if problems:
        return False, "; ".join(problems)
    return True, f"{commit} with patch markers on {', '.join(nodes)}"


def _checks(sc: dict[str, Any] | None, keep: Callable[[str], bool]) -> list[dict[str, Any]]:
    return [c for c in (sc or {}).get("checks", []) or [] if keep(str(c.get("name", "")))]


def _named(c: dict[str, Any]) -> str:
    return f"{c.get('name')} {c.get('status')}" + (f" @ {c.get('node')}" if c.get("node") else "")


def smoke(model: ReportModel, run: Path, sidecars: Sidecars) -> Outcome:
    name, sc = find_sidecar(sidecars, "smoke")
    if sc is None:
        return False, "step 05 did not run (no smoke sidecar)"
    rows = _checks(sc, lambda n: not n.startswith("quality."))
    bad = [c for c in rows if c.get("status") in FAILED]
    if not rows:
        return False, f"steps/{name}.json records no smoke check"
    if bad or sc.get("status") != "passed":
        return False, f"steps/{name}.json {sc.get('status')}" + (": " + ", ".join(_named(c) for c in bad[:5])
                                                                  if bad else "")
    return True, f"{len(rows)} checks, none failed"


def _gate(sidecars: Sidecars, suffix: str, prefix: str, what: str) -> Outcome:
    name, sc = find_sidecar(sidecars, suffix)
    if sc is None:
        return False, f"step {what} did not run (no {suffix} sidecar)"
    rows = _checks(sc, lambda n: n.startswith(prefix))
    if not rows:
        return False, f"no {prefix}* checks in steps/{name}.json"
    bad = [c for c in rows if c.get("status") in FAILED + NOT_RUN]
    if bad:
        return False, ", ".join(_named(c) for c in bad[:6]) + (f" (+{len(bad) - 6} more)" if len(bad) > 6 else "")
    return True, f"{len(rows)} {prefix}* checks passed"


def quality_gate(model: ReportModel, run: Path, sidecars: Sidecars) -> Outcome:
    return _gate(sidecars, "smoke", "quality.", "05")


def tools(model: ReportModel, run: Path, sidecars: Sidecars) -> Outcome:
    return _gate(sidecars, "vision_tools", "tools.", "06")


def bench(model: ReportModel, run: Path, sidecars: Sidecars) -> Outcome:
    name, path, result = find_bench_result(run, sidecars)
    if not name:
        return False, "step 07 did not run (no bench sidecar)"
    if result is None:
        return False, f"steps/{name}.json names no bench result"
    cfg = result.get("config") or {}
    cond = cfg.get("conditions") if isinstance(cfg.get("conditions"), dict) else {}
    seed = cond.get("published") if isinstance(cond.get("published"), dict) else None
    problems = []
    if seed is None:
        problems.append(f"not configured from a seed's published conditions ({cond.get('source') or 'none recorded'})")
    if cfg.get("endpoint") != "chat":
        problems.append(f"endpoint {cfg.get('endpoint')!r} (seed: 'chat')")
    temp = number(cfg.get("temperature"))
    if temp != 0:
        problems.append("temperature not recorded" if temp is None else f"temperature {temp:g} (seed: 0)")
    kwargs = cfg.get("chat_template_kwargs") if isinstance(cfg.get("chat_template_kwargs"), dict) else {}
    keys = [cfg["thinking_key"]] if cfg.get("thinking_key") else list(((seed or {}).get("thinking_off") or {}))
    if not (cond.get("thinking") == "off" and keys and all(kwargs.get(k) is False for k in keys)):
        problems.append(f"thinking not recorded as off (conditions.thinking={cond.get('thinking')!r}, "
                        f"chat_template_kwargs={kwargs})")
    for key in ("workload", "prompt_tokens", "decode_tokens", "concurrency", "prefill_tokens"):
        if seed is not None and cfg.get(key) != seed.get(key):
            problems.append(f"{key} {cfg.get(key)!r} (seed: {seed.get(key)!r})")
    if result.get("status") == "FAIL":
        problems.append("result status FAIL")
    if not any(c.get("kind") == "decode" for c in result.get("cases") or []):
        problems.append("no decode case measured")
    where = str(path.relative_to(run)) if path is not None else f"steps/{name}.json"
    if problems:
        return False, f"{where} not under seed conditions: " + "; ".join(problems)
    return True, f"{where}: the seed conditions of RECIPE={cfg.get('recipe') or model.profile.get('RECIPE')}"


#: (label, requirement) in the order the reasons are listed
REQUIREMENTS: tuple[tuple[str, Callable[[ReportModel, Path, Sidecars], Outcome]], ...] = (
    ("hardware", hardware), ("image", image), ("model revision", model_revision),
    ("Engram revision", engram_revision), ("recipe checkout", recipe_checkout), ("smoke", smoke),
    ("quality gate", quality_gate), ("tools", tools), ("bench", bench))
