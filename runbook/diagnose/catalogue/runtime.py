"""Failures of the runtime and the server: docker pull errors, READY then dead on a request, another
model on the port, and a serving wedge (/health 200, no tokens)."""
from __future__ import annotations

import json
import re
from typing import Callable

from ...facts import docker_pull
from ...facts.prom import MetricsSnapshot
from .. import bundle as B
from .entry import FATAL, STARTUP_DONE, WARNING, Entry, Hit


#: the layer was downloaded and failed while docker extracted it onto its data root: the disk, not the network
#: (moby daemon/images: `failed to register layer: ...`; the tar writer's `unexpected EOF` or `no space left on
#: device` after `Extracting`; disk-full names it)
EXTRACTION_FAILED = re.compile(r"failed to register layer|no space left on device|Error processing tar file",
                               re.IGNORECASE)


def _pull_sig(kind: str) -> Callable[[B.Bundle], list[Hit]]:
    def sig(b: B.Bundle) -> list[Hit]:
        hits = []
        for node, name, text in b.named(B.DOCKER_PULL.split(".")[0]):
            if EXTRACTION_FAILED.search(text):        # a full disk while extracting, never a dropped download
                continue
            err = docker_pull.classify_pull(text)
            if err and err.kind == kind:
                hits.append(Hit(node, [f"{node} {name}: {err.line}"]))
        for node, text in b.logs():
            if "Unable to find image" in text and not EXTRACTION_FAILED.search(text):
                err = docker_pull.classify_pull(text)
                if err and err.kind == kind:
                    hits.append(Hit(node, [f"{node} docker run: {err.line}"]))
        return hits
    return sig


DOCKER_PULL_EOF = Entry(
    "docker-pull-eof", "docker pull: connection dropped (unexpected EOF)", WARNING,
    symptom="`docker pull` fails with `unexpected EOF`",
    detect="`unexpected EOF` / connection reset in docker pull output",
    cause="the download was cut mid-layer (network, proxy, registry)",
    fix="retry the pull: it resumes from the layers already fetched",
    proof="docker pull {image}",
    signature=_pull_sig("unexpected-eof"), source="anchors-2026-12 #15",
    # not when the layer failed while being extracted (disk-full): the same EOF, another cause
    words=(r"^(?!.*(register layer|no space left|disk (is )?full|extract)).*(docker pull|pulling|pull (fails|failed)|download(ing)? (the )?image)",
           r"unexpected eof|connection (reset|dropped|cut)|(drops|stops|dies) (mid|halfway|partway)",),
    lab="capture_netns docker_pull_eof (a registry stub that cuts the layer)")


DOCKER_PULL_MANIFEST_UNKNOWN = Entry(
    "docker-pull-manifest-unknown", "docker pull: tag or digest does not exist", FATAL,
    symptom="`docker pull` fails with `manifest unknown`",
    detect="`manifest unknown` / `manifest for ... not found` in docker pull output",
    cause="the IMAGE tag or digest does not exist in that registry (typo, deleted tag); retrying never helps",
    fix="fix IMAGE in the profile (check the registry's tag list); stop retrying",
    proof="docker manifest inspect {image}",
    signature=_pull_sig("manifest-unknown"), source="anchors-2026-12 #15",
    # a reporter's words: the pull fails and the image (or tag) is not on the registry
    words=(r"docker pull|pulling|pull (fails|failed)|download(ing)? (the )?image|"
           r"(can'?t|couldn'?t|cannot|could not|unable to) pull\b",
           r"manifest unknown|manifest .{0,40}not found|tag (does not|doesn'?t) exist|no such tag|"
           r"(\b(not|nor|never|no)\b|n'?t\b).{0,30}\b(find|found|exists?|see|listed)\b.{0,40}\b(on|in) (the )?"
           r"(docker ?hub|hub\.docker\.com|registry|ghcr|nvcr)",),
    lab="capture_netns docker_pull_manifest")


DOCKER_PULL_DNS = Entry(
    "docker-pull-dns", "docker pull: registry host name does not resolve", FATAL,
    symptom="`docker pull` fails with `no such host`",
    detect="`no such host` / `Temporary failure in name resolution` in docker pull output",
    cause="DNS on the node (resolver, /etc/resolv.conf, offline node), not the registry",
    fix="fix name resolution on that node (`resolvectl status`), or pull on a connected node and "
        "`docker save | ssh node docker load`",
    proof="getent hosts <registry host>   # on the node",
    signature=_pull_sig("dns"), source="anchors-2026-12 #15",
    words=(r"docker pull|pulling|pull (fails|failed)|download(ing)? (the )?image",
           r"no such host|name resolution|\bdns\b|resolv",),
    lab="capture_netns docker_pull_dns")


DOCKER_PULL_UNREACHABLE = Entry(
    "docker-pull-unreachable", "docker pull: the registry does not answer", FATAL,
    symptom="`docker pull` fails with `connect: connection refused`",
    detect="`connection refused` / `no route to host` / `network is unreachable` on the registry's address in "
           "docker pull output",
    cause="nothing answers at the registry's address: the registry is down, the IMAGE's host or port is wrong, "
          "or a firewall rejects the connection; the node's name resolution worked",
    fix="check that the registry runs and listens on that address (`curl -s http://<host:port>/v2/` from the "
        "node answers with HTTP 200); fix the host:port in IMAGE; or pull on a connected node and ship the image",
    proof="curl -sS -m 5 http://<registry host:port>/v2/   # on the node",
    signature=_pull_sig("unreachable"), source="lab registry (issue 23): a registry that was stopped",
    words=(r"docker pull|pulling|pull (fails|failed)|download(ing)? (the )?image",
           r"connection refused|refused|no route to host|registry (is )?(down|stopped|not running)",),
    lab="tests/lab/test_registry_lab.py::test_failed_pulls_reach_the_catalogue")


_ENGINE_DEATH = re.compile(r"EngineDeadError|EngineCore encountered a fatal error|Engine core proc \S+ died unexpectedly|"
                           r"engine core exited unexpectedly|"
                           r"[Ii]llegal instruction|SIGILL|core dumped|Fatal Python error|"
                           r"EngineCore.*(?:died|exited unexpectedly)")


def _sig_ready_then_dead(b: B.Bundle) -> list[Hit]:
    text = b.text(b.head, B.RANK_LOG)
    lines = text.splitlines()
    ready = next((i for i, l in enumerate(lines) if STARTUP_DONE.search(l)), None)
    if ready is None:
        return []
    after = lines[ready + 1:]
    deaths = [l.strip()[:300] for l in after if _ENGINE_DEATH.search(l)][:3]
    if not deaths:
        return []
    last_req = [l.strip()[:200] for l in after if re.search(r'"POST /v1/(chat/)?completions', l)][-1:]
    return [Hit(b.head, [f"{b.head}: READY ('Application startup complete'), then:"] + deaths
                + [f"{b.head}: last request before: {r}" for r in last_req])]


READY_THEN_DEAD = Entry(
    "ready-then-dead", "READY, then EngineCore died on a request", FATAL,
    symptom="`/health` was 200, then the first long prompt kills the server",
    detect="the head's log shows `Application startup complete` and, after it, an EngineCore death "
           "(`EngineDeadError`, `died unexpectedly`, `Illegal instruction`, `core dumped`)",
    cause="a prefill kernel fails on long inputs (e.g. `illegal instruction` under CUDA-graph capture); "
          "short smoke prompts never reach it",
    fix="reproduce with one prompt of >= 3k tokens; try --enforce-eager or a lower "
        "--max-num-batched-tokens to locate the kernel; report with this bundle",
    proof="grep -nE 'Application startup complete|EngineDeadError|died unexpectedly|Illegal instruction' <head rank log>",
    signature=_sig_ready_then_dead, source="anchors-2026-12 #8",
    words=(r"first (long|big|real) (prompt|request)|long (prompt|input|request)|\d+k(-token)? (tokens? )?prompt",
           r"health (is|was|returns?|returned) 200|\bready\b|startup complete|came up|smoke (test )?pass\w*",
           r"died|dies|crash\w*|enginedead|illegal instruction|core dump",),
    lab="capture_netns ready_then_dead (EngineCore killed after READY)")


def _sig_wrong_model(b: B.Bundle) -> list[Hit]:
    text = b.text(B.LOCAL, B.LOCAL_MODELS)
    want = b.context.served_model_name
    if not text.strip() or not want:
        return []
    try:
        ids = [m.get("id") for m in json.loads(text).get("data", [])]
    except (json.JSONDecodeError, AttributeError):
        return []
    if want in ids:
        return []
    return [Hit(B.LOCAL, [f"/v1/models on port {b.context.port} lists {ids or 'no model'}; the profile serves '{want}'"])]


WRONG_MODEL_ON_PORT = Entry(
    "wrong-model-on-port", "The port answers for a different model", FATAL,
    symptom="requests fail with `model ... does not exist` or hit an old server",
    detect="`/v1/models` on the API port does not list SERVED_MODEL_NAME",
    cause="another server (an older run, another user) holds the port",
    fix="`python -m runbook stop --profile <profile>` when it is an earlier run of the runbook (every rank on every "
        "node, orphaned EngineCore/Worker processes included); else stop the other server (`ss -ltnp 'sport = "
        ":{port}'` names it); changing PORT leaves an orphaned server holding memory",
    proof="curl -s {api_url}/v1/models   # on the head (the address the API binds)",
    signature=_sig_wrong_model,
    source="vLLM vllm/entrypoints/serve/engine/serving.py:78,213 @ v0.32.0 (The model `X` does not exist); "
           "anchors-2026-12 #10",
    # the 404 line alone names a model the server does not serve: served-model-name-mismatch; this entry is the
    # live check that /v1/models lists another model (another server holds the port)
    words=(r"does not exist|\b404\b|wrong model|different model|old (server|model)|another model",
           r"/v1/models|model (id|name)|served[- ]model[- ]name|\bport\b",),
    lab="tests/lab/test_diagnose_lab.py::test_diagnose_names_a_port_answering_for_another_model")


WEDGE_MIN_INTERVAL_S = 10.0


def _sig_wedge(b: B.Bundle) -> list[Hit]:
    health = b.text(B.LOCAL, B.LOCAL_HEALTH).strip()
    m1, m2 = b.text(B.LOCAL, B.LOCAL_METRICS_1), b.text(B.LOCAL, B.LOCAL_METRICS_2)
    interval = b.timings.get("metrics_interval_s", 0.0)
    if not (health.startswith("200") and m1 and m2 and interval >= WEDGE_MIN_INTERVAL_S):
        return []
    s1, s2 = MetricsSnapshot.from_text(0.0, m1), MetricsSnapshot.from_text(interval, m2)
    busy = [(s.total("vllm:num_requests_running") or 0) + (s.total("vllm:num_requests_waiting") or 0) for s in (s1, s2)]
    g1, g2 = s1.total("vllm:generation_tokens_total"), s2.total("vllm:generation_tokens_total")
    if g1 is None or g2 is None or min(busy) <= 0 or g2 > g1:
        return []
    return [Hit(B.LOCAL, [f"/health {health}; requests running+waiting {busy[0]:g} then {busy[1]:g}; "
                          f"generation tokens {g1:g} -> {g2:g} over {interval:.0f} s"])]


SERVING_WEDGE = Entry(
    "serving-wedge", "Serving wedge: /health 200 but no tokens", FATAL,
    symptom="clients hang; /health still says 200",
    detect="two /metrics scrapes at least 10 s apart: requests running or waiting > 0 in both and "
           "`vllm:generation_tokens_total` did not move, while /health is 200",
    cause="a rank stopped inside a collective (frozen process, fabric down, NCCL hang) while the API "
          "process stays up",
    fix="check the fabric and each rank (other findings); restart both ranks together",
    proof="curl -s {api_url}/metrics | grep -E 'num_requests_(running|waiting)|generation_tokens_total'   # on the head",
    signature=_sig_wedge, source="anchors-2026-12 #9; vLLM #40969",
    words=(r"/health (\w+ ){0,2}(ok|200|green)|health ?check (\w+ )?(passes|ok|green)|health (is |stays )?(ok|200|fine)",
           r"no tokens|no output|hangs?\b|stuck|never (returns|finish\w*)|requests? (hang|pile|queue)|num_requests_running|generation_tokens",),
    lab="tests/lab/test_watchdog_lab.py::test_frozen_worker_rank_is_caught_and_recovers")


NO_COMMON_BLOCK_SIZE = Entry(
    "no-common-block-size", "No KV block size every attention backend accepts", FATAL,
    symptom="the start fails at KV-cache set-up with `No common block size for 64`",
    detect="`No common block size for N` in a rank log",
    cause="vLLM picked the smallest listed block size, which the DeepSeek V4 indexer backend refuses",
    fix="pass `--block-size 128` (EXTRA_ARGS)",
    proof="grep -n 'block size' <rank log>",
    signature=None,
    source="vLLM vllm/v1/worker/utils.py:555 @ v0.32.0 (No common block size); tonyd2wild/DeepSeek-V4.1-Flash-vLLM-DGX-Spark "
           "README fix 4 (boot 4)",
    lines=(r"No common block size for \d+",),
    words=(r"block[- _]size", r"no common|indexer|deepseek|v4"),
    lab="none: the tiny lab model has no V4 indexer")
