"""``python -m runbook plan``: the fit verdict of a profile, without touching any node.

Node facts come from (in this order): ``--facts`` (a preflight sidecar, a run folder, or ``latest``);
for RECIPE=lab this machine (the lab's nodes run on it); else a nominal GB10 (docs/fit.md).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import CheckFailed, RunbookError
from ..evidence import RESULTS_ROOT
from ..profile import load_profile
from .budget import DOES_NOT_FIT, FITS, plan, versus
from .facts import (INDEX_NAME, checkpoint_size_cmd, find_preflight, index_total_size, load_sidecar,
                    local_facts, node_facts_from_sidecar, nominal_facts, parse_checkpoint_size, LocalHost)
from .figures import MEASURED, Figure
from .render import plan_text, versus_text


def add_parser(subparsers) -> argparse.ArgumentParser:
    sp = subparsers.add_parser("plan", help="will the profile fit the nodes' memory and disks? (touches no node)")
    sp.add_argument("--profile", default="env/lab.env")
    sp.add_argument("-p", "--param", action="append", metavar="KEY=VALUE", help="override a profile key")
    sp.add_argument("--facts", metavar="SIDECAR|RUN_DIR|latest",
                    help="cached node facts: results/<run>/steps/00_preflight.json, a run folder, or 'latest' "
                         "(newest run of this profile); default: nominal GB10 figures (this host for the lab)")
    sp.add_argument("--results", help="results folder searched by --facts latest (default: results/)")
    sp.add_argument("--index", metavar="PATH",
                    help=f"the checkpoint's local {INDEX_NAME} (or its folder) for the weights size")
    sp.add_argument("--model-dir", metavar="DIR",
                    help="a local checkpoint (config.json + safetensors): the decode roofline from its headers "
                         "(default: the recipe's config values and stated dtypes)")
    sp.add_argument("--layouts", metavar="LIST",
                    help="per-rank memory and decode ceiling at these parallel layouts, e.g. tp2,tp3,tp4,tp2xpp2 "
                         "(docs/fit.md \"Parallel layouts\")")
    sp.add_argument("--json", action="store_true", help="print the plan as JSON")
    sp.set_defaults(func=cmd_plan)
    return sp


def _overrides(pairs: list[str] | None) -> dict[str, str]:
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep:
            raise RunbookError(f"override {pair!r} is not KEY=VALUE", fix="write -p GPU_MEM_UTIL=0.85")
        out[key.strip()] = value
    return out


def local_checkpoint(arg: str) -> Figure:
    """``--index``: an index file, or a folder holding one (or single-file ``*.safetensors``)."""
    p = Path(arg)
    if p.is_file():
        return Figure(index_total_size(p.read_text(), str(p)), MEASURED, f"metadata.total_size of {p}")
    if p.is_dir():
        total = parse_checkpoint_size(LocalHost().read(checkpoint_size_cmd(str(p.resolve()))).stdout)
        if total:
            return Figure(total, MEASURED, f"checkpoint in {p}")
    raise RunbookError(f"--index {arg}: no {INDEX_NAME} or *.safetensors there",
                       fix=f"pass the checkpoint's {INDEX_NAME} or the folder holding it")


def decode_roofline(profile, model_dir: str | None) -> tuple[str, dict]:
    """The decode ceiling per rank before any hardware: bytes per step per rank (checkpoint headers or
    the recipe's config and dtypes) against the published GB10 bandwidth and all-reduce latency; on the
    lab, this host's CPU memory bandwidth (measured now, a second). Never changes the exit code."""
    from . import roofline as R
    try:
        r = R.roofline_for(profile, model_dir=model_dir)
    except RunbookError as exc:
        return f"decode roofline: not computed ({exc.what}; fix: {exc.fix})", {"error": exc.what}
    if r is None:
        return (f"decode roofline: RECIPE={profile.recipe} states no architecture for the config-only path; "
                f"pass --model-dir with the downloaded checkpoint (config.json + safetensors)"), {}
    if profile.is_lab or profile.lab:         # lab hardware (a rehearsal too): this host's CPU memory
        from ..facts.membw_probe import cpu_probe
        bw = cpu_probe(64 << 20, 5)
        ceilings = {"lab CPU": r.ceiling(bw["gbs"] * 1e9, 0.0)}
        note = (f"{bw['label']}: {bw['gbs']:.1f} GB/s measured on this host now; all-reduce latency not "
                f"included (01_network's gloo sweep measures it; the report's panel uses it)")
    else:
        ceilings = R.spark_ceilings(r)
        note = (f"[published] {R.GB10_PEAK_BW.note}; {R.GB10_DECODE_BW.note}; all-reduce {R.ALLREDUCE_FAST.note}; "
                f"{R.ALLREDUCE_SLOW.note}")
    return (R.roofline_text(r, ceilings, bandwidth_note=note),
            {**r.to_dict(), "ceilings": {k: c.to_dict() for k, c in ceilings.items()}, "bandwidth_note": note})


def layouts_section(profile, text: str, model_dir: str | None, facts, checkpoint: Figure | None) -> tuple[str, list]:
    """``--layouts``: per-rank memory and the decode ceiling at each layout (layouts.py)."""
    from . import layouts as L
    from . import roofline as R
    wanted = L.parse_layouts(text)
    roof = L.roofline_or_fallback(profile, model_dir)
    if profile.is_lab or profile.lab:
        from ..facts.membw_probe import cpu_probe
        bw = cpu_probe(64 << 20, 5)
        ceilings = {"lab CPU": (bw["gbs"] * 1e9, 0.0)}
        notes = {"lab CPU": f"{bw['label']}: {bw['gbs']:.1f} GB/s measured on this host now; all-reduce latency "
                            "not included"}
    else:
        ceilings = {"best": (R.GB10_PEAK_BW.value, R.ALLREDUCE_FAST.value),
                    "decode-shaped": (R.GB10_DECODE_BW.value, R.ALLREDUCE_SLOW.value)}
        notes = {"best": f"[published] {R.GB10_PEAK_BW.note}; {R.ALLREDUCE_FAST.note}",
                 "decode-shaped": f"[published] {R.GB10_DECODE_BW.note}; {R.ALLREDUCE_SLOW.note}"}
    rows = L.layout_rows(profile, wanted, roof=roof, facts=facts, checkpoint=checkpoint, ceilings=ceilings)
    text_out = L.layouts_text(profile, rows, notes)
    if roof is not None:
        text_out += f"\n- bytes: {roof.step.source}" + "".join(f"; {a}" for a in roof.step.assumptions)
    return text_out, [r.to_dict() for r in rows]


def two_node_recipe(profile):
    """The shipped profile of the same recipe (``env/<RECIPE>.env``) when ``profile`` runs it on another number
    of nodes: what ``plan`` sets the per-rank figures beside. None for the lab, or the same node count."""
    from ..profile import REPO_ROOT
    path = REPO_ROOT / "env" / f"{profile.recipe}.env"
    if profile.is_lab or not path.is_file():
        return None
    base = load_profile(path)
    return base if base.node_count != profile.node_count else None


def cmd_plan(args) -> int:
    profile = load_profile(args.profile, overrides=_overrides(args.param))
    checkpoint = local_checkpoint(args.index) if args.index else None
    if args.facts:
        root = Path(args.results) if args.results else RESULTS_ROOT
        side = find_preflight(profile, args.facts, root)
        facts = node_facts_from_sidecar(profile, load_sidecar(side), str(side))
        origin = f"cached preflight {side}"
    elif profile.is_lab:
        facts, origin = local_facts(profile), "measured on this host (the lab's nodes share it)"
    else:
        facts = nominal_facts(profile)
        origin = ("nominal GB10 (no node measured): MemTotal nominal, MemAvailable published, "
                  "disk an empty 4 TB NVMe -- run preflight and pass --facts for measured figures")
    result = plan(profile, facts, checkpoint=checkpoint, origin=origin)
    roof_text, roof_dict = decode_roofline(profile, args.model_dir)
    lay_text, lay_rows = (layouts_section(profile, args.layouts, args.model_dir, facts, checkpoint)
                          if args.layouts else ("", None))
    base = two_node_recipe(profile)
    node = next(iter(facts.values()), None)
    vs = versus(profile, base, node.mem_total, checkpoint) if base is not None and node is not None else None
    if args.json:
        extra = {"layouts": lay_rows} if lay_rows is not None else {}
        if vs is not None:
            extra["versus"] = vs.to_dict()
        print(json.dumps({**result.to_dict(), "roofline": roof_dict, **extra}, indent=2, default=str))
    else:
        print(plan_text(result))
        if vs is not None:
            print("\n" + versus_text(vs))
        print("\n" + roof_text)
        if lay_text:
            print("\n" + lay_text)
    if result.verdict == DOES_NOT_FIT:
        print(f"\n{result.verdict}: turn {', '.join(result.knobs()) or 'the knobs above'}", file=sys.stderr)
        return CheckFailed.exit_code
    if result.verdict != FITS:
        print(f"\n{result.verdict}: no facts for {', '.join(result.missing)} (re-run preflight)", file=sys.stderr)
        return 1
    return 0
