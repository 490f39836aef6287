"""Step 07's roofline: how close the measured decode is to what the memory bandwidth allows.

``roofline_of`` reads the bytes per decode step from the checkpoint itself (the lab's tiny model here; a recipe's
checkpoint from its safetensors headers on the head, where step 02 put it), falling back to the recipe's stated
config; ``panel`` puts it beside the measured bandwidth per rank (``membw.py``) and 01's all-reduce latency, one row
per workload class (``benchmark/roofline_panel.py``). The arithmetic is in ``fit/roofline.py``."""
from __future__ import annotations

from typing import Any

from ..benchmark import roofline_panel as P
from ..benchmark.result import BenchResult
from ..errors import RunbookError
from ..facts.node_paths import on_node
from ..fit import roofline as R
from ..records import NetworkRecord
from ..site import SPARKS_SITE, Site
from ..weights_tools.layout import weights_layout


def roofline_of(cluster, profile, echo=print, *, site: Site = SPARKS_SITE) -> R.Roofline | None:
    """The model's roofline for this run, from the checkpoint itself: the lab's tiny model from its
    safetensors headers on this machine (``site.model_dir``); a recipe's checkpoint from its headers read on the head
    (``roofline.HEADER_DUMP_SCRIPT``, where step 02 put it). Falls back to the recipe's config values
    and stated dtypes (``roofline.ARCH``; said in the source) when the headers cannot be read; None
    when the recipe states no architecture either."""
    if site.model_dir is not None:         # the lab's hardware, also in a rehearsal of a recipe
        d = site.model_dir(profile)
        return R.roofline_for(profile, model_dir=d if (d / "config.json").is_file() else None)
    try:
        head = cluster.head
        tree = weights_layout(profile).tree(on_node(head, profile.weights_dir_on(head.name)))
        res = head.read(R.header_dump_cmd(tree), timeout=150)
        sb, config = R.step_bytes_from_dump(res.stdout)
        return R.Roofline(sb, config, int(profile.tp), int(profile.bench_prompt_tokens),
                          str(profile.kv_cache_dtype or ""), int(profile.spec_k), int(profile.pp))
    except (RunbookError, OSError, ValueError, KeyError) as exc:
        echo(f"roofline: the checkpoint's headers on the head were not read ({exc}); the recipe's config values")
        return R.roofline_for(profile)


def panel(cluster, profile, result: BenchResult, membw_data: dict[str, Any],
          network: NetworkRecord | None, *, site: Site = SPARKS_SITE) -> dict[str, Any]:
    """The panel's inputs and rows (step 07's ``data["roofline"]``): bytes per step, the slowest rank's
    measured bandwidth (else the published GB10 decode figure), the all-reduce latency of 01_network's
    sweep (``network``: its record in this run; else the published NCCL figure on Sparks, none on the lab), one row per
    class case."""
    try:
        roof = roofline_of(cluster, profile, site=site)
    except Exception as exc:  # noqa: BLE001 - the panel never fails the bench
        return {"error": f"{type(exc).__name__}: {exc}"}
    if roof is None:
        return {"error": f"RECIPE={profile.recipe}: no architecture for the config-only roofline"}
    on_lab = site.on_lab                 # lab hardware, also in a rehearsal
    bw, bw_note = P.slowest_bandwidth(membw_data)
    if bw is None and not on_lab:
        bw, bw_note = R.GB10_DECODE_BW.value, f"[published] {R.GB10_DECODE_BW.note} ({bw_note})"
    ar, ar_note = P.allreduce_latency(network)
    if ar is None:
        ar, ar_note = ((0.0, f"{ar_note}: no all-reduce cost counted") if on_lab
                       else (R.ALLREDUCE_SLOW.value, f"[published] {R.ALLREDUCE_SLOW.note} ({ar_note})"))
    measured = network is not None and bool(network.allreduce)
    out: dict[str, Any] = {**roof.to_dict(), "bandwidth": bw, "bandwidth_note": bw_note, "allreduce_s": ar,
                           "allreduce_note": ar_note, "allreduce_measured": measured, "comparable": not on_lab}
    if bw:
        out["rows"] = P.panel_rows(result, roof, bandwidth=bw, allreduce_s=ar, recipe=profile.recipe,
                                   comparable=not on_lab)
        out["rank_rows"] = P.rank_rows(roof, membw_data, bandwidth=bw, allreduce_s=ar,
                                       ranks=int(profile.tp),      # the all-reduce spans the TP group
                                       allreduce_measured=measured, pp=int(profile.pp))
    return out
