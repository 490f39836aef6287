"""Step 07's conditions: the benchmark configuration from the profile, the previous good run's result, and the
`vllm bench serve` cross-check.

Recipe profiles measure under the seeds' published conditions (``conditions.SEEDS``: chat, prose,
temperature 0, thinking off, the published lengths, the 32k/256k prefill cases); the lab keeps
sizes scaled to the tiny model. The figures are compared with the published figures of the
matching recipe and workload class and with the previous good run of the same profile.
"""
from __future__ import annotations

from pathlib import Path

from ..evidence import previous_good_run
from ..errors import BenchError
from ..benchmark.conditions import PROFILE_KEYS, SEEDS
from ..api.prompts import CLASSES
from ..benchmark.result import BenchConfig, BenchResult
from ..records import BENCH
from ..site import SPARKS_SITE, Site

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
                  recipe=profile.recipe, label=profile.profile_name, nodes=profile.node_count,
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


def previous_result(run_path: Path, step_name: str = BENCH.id) -> BenchResult | None:
    """The bench result of the previous good run (``evidence.previous_good_run``, the run the report's
    drift compares with), if it has one."""
    previous = previous_good_run(run_path)
    result = previous / "raw" / step_name / RAW_DIR_NAME / "result.json" if previous else None
    return BenchResult.load(result) if result is not None and result.is_file() else None


def cross_check(profile, server, result: BenchResult, out_dir: Path, *, enabled: bool = True, python: str = "",
                tokenizer: str = "", site: Site = SPARKS_SITE):
    """The notebook's optional cell: the single-stream decode cell measured again by ``vllm bench
    serve`` with a fresh seed (``runbook.benchmark.crosscheck``), its log under ``out_dir``. On the lab the site
    gives its vLLM venv and the tiny model's tokenizer; elsewhere pass ``python`` (a python with vLLM)
    and ``tokenizer`` (default: the profile's HF_MODEL_REPO, fetched by vLLM). Returns the row and the
    figures to record (empty when nothing ran)."""
    from ..checks import not_applicable
    from ..benchmark import crosscheck
    if not enabled:
        return not_applicable(crosscheck.CHECK_NAME, "vllm_cross_check=False", node="local"), {}
    lab_python = Path(site.vllm_python) if site.vllm_python else None     # the lab's, also in a rehearsal
    lab_tokenizer = site.model_dir(profile) if site.model_dir is not None else None
    py = crosscheck.find_vllm_python(python, lab_python=lab_python)
    tok = tokenizer or (str(lab_tokenizer) if lab_tokenizer and lab_tokenizer.is_dir() else profile.hf_model_repo)
    return crosscheck.cross_check(result, base_url=server.base_url, model=server.model, python=py,
                                  tokenizer=tok, out_dir=out_dir, api_key=server.api_key or None)
