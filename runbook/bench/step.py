"""Step 07 — benchmarks against the launched server, with the profile's sizes.

Recipe profiles measure under the seeds' published conditions (``conditions.SEEDS``: chat, prose,
temperature 0, thinking off, the published lengths, the 32k/256k prefill cases); the lab keeps
sizes scaled to the tiny model. The figures are compared with the published figures of the
matching recipe and workload class and with the previous good run of the same profile.
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..evidence import previous_good_run
from ..checks import not_applicable
from ..errors import BenchError
from . import membw
from .conditions import PROFILE_KEYS, SEEDS
from .prompts import CLASSES
from .result import BenchConfig, BenchResult
from .runner import run_benchmark

RAW_DIR_NAME = "bench"
CLASS_PROMPT_TOKENS = 1024


def config_from_profile(profile, *, repeats: int | None = None, soak_seconds: float | None = None) -> BenchConfig:
    """The step's BenchConfig. Recipe profiles measure under the seeds' published conditions
    (:data:`conditions.SEEDS`: chat, prose, temperature 0, thinking off, the published lengths,
    concurrency and the 32k/256k prefill cases); a BENCH_* key the profile sets itself wins and is
    listed in ``conditions["deviations"]``. The lab keeps its scaled sizes (completions, filler).
    Both run the workload-class panel (prose, code, structured, tool; thinking off and on; C=1)."""
    common = dict(repeats=profile.bench_repeats if repeats is None else repeats,
                  soak_seconds=float(profile.soak_seconds if soak_seconds is None else soak_seconds),
                  recipe=profile.recipe, label=profile.profile_name,
                  classes=CLASSES, class_thinking=("off", "on"), class_concurrency=1,
                  # the tool class carries its tool definitions (~600 tokens with a chat template): class
                  # prompts are long enough for every class to have a body of its own
                  class_prompt_tokens=CLASS_PROMPT_TOKENS)
    seed = None if profile.is_lab else SEEDS.get(profile.recipe)
    if seed is None:
        return BenchConfig(endpoint="completions", workload="filler",
                           prompt_tokens=profile.bench_prompt_tokens, decode_tokens=profile.bench_decode_tokens,
                           concurrency=tuple(profile.bench_concurrency),
                           prefill_tokens=tuple(profile.bench_prefill_tokens),
                           conditions={"source": f"profile BENCH_* keys (RECIPE={profile.recipe}: scaled sizes, "
                                                 "no published figures to match)", "thinking": "server default"},
                           **common)
    explicit = set(profile.key_lines) | set(profile.overrides)
    values: dict[str, object] = {}
    deviations: list[str] = []
    for key, (name, attr) in PROFILE_KEYS.items():
        published, own = getattr(seed, name), getattr(profile, attr)
        if isinstance(published, tuple):
            own = tuple(own)
        if key in explicit and own != published:
            values[name] = own
            deviations.append(f"{key}={','.join(map(str, own)) if isinstance(own, tuple) else own} "
                              f"(published: {','.join(map(str, published)) if isinstance(published, tuple) else published})")
        else:
            values[name] = published
    need = max(int(values["prompt_tokens"]) + int(values["decode_tokens"]),
               max(values["prefill_tokens"], default=0) + 1)
    if need > profile.max_model_len:
        raise BenchError(f"RECIPE={profile.recipe}: the bench's largest request does not fit the context",
                         observed=f"{need} tokens (prefill cases {list(values['prefill_tokens'])}, decode "
                                  f"{values['prompt_tokens']}+{values['decode_tokens']}) > MAX_MODEL_LEN="
                                  f"{profile.max_model_len}",
                         expected="every bench request within MAX_MODEL_LEN",
                         fix=f"raise MAX_MODEL_LEN to >= {need}, or set BENCH_PREFILL_TOKENS in the profile "
                             "(the 256k case is then not comparable with the published figure)")
    return BenchConfig(
        endpoint=seed.endpoint, workload=seed.workload, temperature=seed.temperature,
        chat_template_kwargs=dict(seed.thinking_off), thinking_key=next(iter(seed.thinking_off)),
        conditions={"source": seed.source, "thinking": "off", "workload": seed.workload,
                    "published": seed.to_dict(), "deviations": deviations},
        **values, **common)


def previous_result(run_path: Path, step: str = "07_bench") -> BenchResult | None:
    """The bench result of the previous good run (``evidence.previous_good_run``, the run the report's
    drift compares with), if it has one."""
    previous = previous_good_run(run_path)
    result = previous / "raw" / step / RAW_DIR_NAME / "result.json" if previous else None
    return BenchResult.load(result) if result is not None and result.is_file() else None


def cross_check(step, server, result: BenchResult, *, enabled: bool = True, python: str = "",
                tokenizer: str = ""):
    """The notebook's optional cell: the single-stream decode cell measured again by ``vllm bench
    serve`` with a fresh seed (``runbook.bench.crosscheck``). Lab profiles find the lab's vLLM venv
    and the tiny model's tokenizer; elsewhere pass ``python`` (a python with vLLM) and ``tokenizer``
    (default: the profile's HF_MODEL_REPO, fetched by vLLM)."""
    from ..checks import not_applicable
    from . import crosscheck
    if not enabled:
        return not_applicable(crosscheck.CHECK_NAME, "vllm_cross_check=False", node="local")
    profile = step.profile
    lab_python = lab_tokenizer = None
    if profile.lab:        # the lab's hardware, also in a rehearsal of a recipe
        from ..lab import control
        lab_python = control.VLLM_PYTHON
        lab_tokenizer = control.stand_in_model_dir(profile)
    py = crosscheck.find_vllm_python(python, lab_python=lab_python)
    tok = tokenizer or (str(lab_tokenizer) if lab_tokenizer and lab_tokenizer.is_dir() else profile.hf_model_repo)
    out_dir = step.raw_dir / "vllm-bench"
    check, data = crosscheck.cross_check(result, base_url=server.base_url, model=server.model, python=py,
                                         tokenizer=tok, out_dir=out_dir, api_key=server.api_key or None)
    if data:
        data["log"] = str(Path(data["log"]).relative_to(step.run.path))
        step.data["vllm_cross_check"] = data
    return check


def roofline_of(step, echo=print):
    """The model's roofline for this run, from the checkpoint itself: the lab's tiny model from its
    safetensors headers on this machine; a recipe's checkpoint from its headers read on the head
    (``roofline.HEADER_DUMP_SCRIPT``, where step 02 put it). Falls back to the recipe's config values
    and stated dtypes (``roofline.ARCH``; said in the source) when the headers cannot be read; None
    when the recipe states no architecture either."""
    from ..errors import RunbookError
    from ..fit import roofline as R
    profile = step.profile
    if profile.lab:
        from ..lab import control
        d = control.stand_in_model_dir(profile)
        return R.roofline_for(profile, model_dir=d if (d / "config.json").is_file() else None)
    try:
        from ..weights.layout import weights_layout
        from ..weights.node_paths import on_node
        head = step.cluster.head
        tree = weights_layout(profile).tree(on_node(head, profile.weights_dir_on(head.name)))
        res = head.read(R.header_dump_cmd(tree), timeout=150)
        sb, config = R.step_bytes_from_dump(res.stdout)
        return R.Roofline(sb, config, int(profile.tp), int(profile.bench_prompt_tokens),
                          str(profile.kv_cache_dtype or ""), int(profile.spec_k))
    except (RunbookError, OSError, ValueError, KeyError) as exc:
        echo(f"roofline: the checkpoint's headers on the head were not read ({exc}); the recipe's config values")
        return R.roofline_for(profile)


def roofline_panel(step, result: BenchResult, membw_data: dict[str, Any]) -> dict[str, Any]:
    """The panel's inputs and rows (``step.data["roofline"]``): bytes per step, the slowest rank's
    measured bandwidth (else the published GB10 decode figure), the all-reduce latency of 01_network's
    sweep (else the published NCCL figure on Sparks, none on the lab), one row per class case."""
    from ..fit import roofline as R
    from . import roofline_panel as P
    try:
        roof = roofline_of(step)
    except Exception as exc:  # noqa: BLE001 - the panel never fails the bench
        return {"error": f"{type(exc).__name__}: {exc}"}
    if roof is None:
        return {"error": f"RECIPE={step.profile.recipe}: no architecture for the config-only roofline"}
    on_lab = bool(step.profile.lab) or step.profile.is_lab     # lab hardware, also in a rehearsal
    bw, bw_note = P.slowest_bandwidth(membw_data)
    if bw is None and not on_lab:
        bw, bw_note = R.GB10_DECODE_BW.value, f"[published] {R.GB10_DECODE_BW.note} ({bw_note})"
    net = step.run.path / "steps" / "01_network.json"
    ar, ar_note = P.allreduce_latency(json.loads(net.read_text()) if net.is_file() else None)
    if ar is None:
        ar, ar_note = ((0.0, f"{ar_note}: no all-reduce cost counted") if on_lab
                       else (R.ALLREDUCE_SLOW.value, f"[published] {R.ALLREDUCE_SLOW.note} ({ar_note})"))
    out: dict[str, Any] = {**roof.to_dict(), "bandwidth": bw, "bandwidth_note": bw_note, "allreduce_s": ar,
                           "allreduce_note": ar_note, "comparable": not on_lab}
    if bw:
        out["rows"] = P.panel_rows(result, roof, bandwidth=bw, allreduce_s=ar, recipe=step.profile.recipe,
                                   comparable=not on_lab)
    return out


@dataclass
class BenchOutcome:
    """What notebook 07 shows after the measurement."""
    server: Any                  # serve.server_info.ServerInfo
    config: BenchConfig
    result: BenchResult
    previous: BenchResult | None  # the previous good run's result (the report's drift compares with it too)
    cross: Any                   # the `vllm bench serve` cross-check row
    out_dir: Path
    roofline: dict[str, Any] | None = None   # the roofline panel (roofline_panel): inputs and one row per class
    valid: bool | None = None     # False: a rank's memory bandwidth fell below 80 % of another (bench/membw.py)

    def roofline_table(self):
        """The roofline panel as a DataFrame (measured/ceiling per class and thinking mode)."""
        import pandas as pd
        from .roofline_panel import PANEL_COLUMNS
        rows = (self.roofline or {}).get("rows") or []
        return pd.DataFrame([{k: r.get(k) for k in PANEL_COLUMNS} for r in rows], columns=list(PANEL_COLUMNS))


def run(step, *, base_url: str = "", model: str = "", repeats: int | None = None,
        soak_seconds: float | None = None, vllm_cross_check: bool = True, vllm_python: str = "",
        vllm_tokenizer: str = "", echo=print) -> BenchOutcome:
    """Step 07: find the server (04's, or ``base_url``), measure every cell of the profile's conditions under
    the serving watchdog, record the rows, cross-check one cell with vLLM's own client."""
    from ..launch import watchdog
    from ..serve import endpoint
    from ..serve.server_info import find_server
    server = find_server(step, base_url=base_url, model=model)
    config = config_from_profile(step.profile, repeats=repeats, soak_seconds=soak_seconds)
    # a loopback-bound API is measured through the SSH forward, which costs a few % (docs/bench.md): say so
    route = "direct (base_url)" if base_url else endpoint.api_address(step.profile)
    echo(f"route: {route}")
    echo(server.describe())
    echo(config.to_dict())
    out_dir = step.raw_dir / RAW_DIR_NAME
    # every rank's memory bandwidth before and after: a rank in a slow state makes the bench invalid
    probe_python = _probe_python(step.profile)
    probing = not base_url        # another server's nodes are not the profile's: nothing to probe
    before, rows = membw.probe_ranks(step, "before", probe_python) if probing else ({}, [])
    step.add(rows)
    for node, r in before.items():
        if not r.get("error"):
            echo(f"{node}: {r['gbs']:.1f} GB/s ({r.get('label', '')})")
    # the wedge / API-gone alarm watches the server 04 started, not a foreign one
    with watchdog.watching(step) if not base_url else contextlib.nullcontext():
        result = run_benchmark(server.base_url, server.model, config=config, out_dir=out_dir,
                               api_key=server.api_key or None)
    step.add(result.checks())
    after, rows = membw.probe_ranks(step, "after", probe_python) if probing else ({}, [])
    step.add(rows)
    membw_data = {"before": before, "after": after}
    valid, row = membw.validity(membw_data, gpu=membw.on_gpu(step.profile))
    if not probing:
        row = not_applicable(membw.VALID_ROW, "base_url given: the server's nodes are not the profile's, not probed",
                             node="cluster")
    membw_data["valid"] = valid
    step.add(row)
    step.data["membw"] = membw_data
    step.data["bench"] = {"result": str(out_dir.relative_to(step.run.path) / "result.json"), "route": route,
                          "valid": valid}
    cross = cross_check(step, server, result, enabled=vllm_cross_check, python=vllm_python,
                        tokenizer=vllm_tokenizer)
    step.add(cross)
    panel = roofline_panel(step, result, membw_data)
    step.data["roofline"] = panel
    return BenchOutcome(server, config, result, previous_result(step.run.path), cross, out_dir, panel, valid)


def _probe_python(profile) -> str | None:
    """The python the probe runs with outside a container: next to VLLM_BIN on a GPU profile (it has
    torch), ``python3`` on the lab (the CPU path needs nothing)."""
    if not membw.on_gpu(profile):
        return None
    from ..network.collectives import sweep_python_from
    return sweep_python_from(profile)
