"""Unified-memory failures of a GB10 node: CUDA's "free" is not what the host can give, the driver runs out
of the shared pool during start-up or a long prefill, memory stays pinned after a failed start, JIT
builds at first boot eat the host or take many minutes, and a modprobe override caps CUDA memory."""
from __future__ import annotations

from ...facts import hostlog, procs, system
from .. import bundle as B
from .entry import DEGRADED, FATAL, WARNING, Entry, Hit
from .host import RECENT_S, older_than_start, rank_started


UMA_FREE_MEMORY_CHECK = Entry(
    "uma-free-memory-check", "Start refused: CUDA's free memory counts the page cache as used", FATAL,
    symptom="vLLM refuses to start with `Free memory on device ... is less than desired GPU memory utilization` "
            "while `free -h` shows plenty available",
    detect="`Free memory on device cuda:N (x/y GiB) on startup is less than desired GPU memory utilization` in a "
           "rank log",
    cause="on unified memory `cudaMemGetInfo` reports `MemFree`, so reclaimable page cache (the weights just "
          "read) counts as used and the start-up check fails although `MemAvailable` is ample",
    fix="drop the page cache right before the start (`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`) or "
        "lower GPU_MEM_UTIL; budget from MemAvailable, not CUDA's free; never auto-retry (each failed start "
        "can leave memory pinned)",
    proof="grep -E 'MemFree|MemAvailable|^Cached' /proc/meminfo   # on the node that refused",
    signature=None,
    source="vLLM vllm/v1/worker/utils.py:766 @ v0.32.0 (Free memory on device ... is less than desired GPU memory "
           "utilization); vllm-project/vllm#48140, #35313; unslothai/unsloth#10705; Blackwellboy/model-serving-minefield#45; "
           "bringup-anchors §5.15",
    lines=(r"Free memory on device \S+ \([\d.]+/[\d.]+ GiB\) on startup is less than desired GPU memory utili[sz]ation",
           r"less than desired GPU memory utili[sz]ation"),
    words=(r"not enough (free )?memory|free memory.{0,40}less than|less than desired|startup (memory )?check",
           r"memavailable|available memory|free -h|page ?cache|buff/cache|\bcached?\b|memfree",
           r"gpu[_ -]mem(ory)?[_ -]util\w*|\bgmu\b|memory utili[sz]ation",
           r"refus\w* to (start|boot|load)|won'?t (start|boot)|fails? (at|on|during) (start|boot)|before (it )?load|drop_caches|drop caches"),
    lab="none: CPU vLLM does not run the CUDA free-memory check")


def _sig_pool(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        started = rank_started(b, node)
        if started is None and b.timings.get("collected_at"):
            started = b.timings["collected_at"] - RECENT_S
        text = b.text(node, B.DMESG) + "\n" + b.text(node, B.JOURNAL) + "\n" + b.text(node, B.RANK_LOG)
        lines = [l for l in hostlog.gpu_oom_lines(text) if not older_than_start(l, started)]
        if lines:
            hits.append(Hit(node, [f"{node}: {l[:200]}" for l in lines[:3]]))
    return hits


UMA_POOL_EXHAUSTED = Entry(
    "uma-pool-exhausted", "The unified memory pool ran out inside the driver (NV_ERR_NO_MEMORY)", FATAL,
    symptom="the host wedges or hard-resets during start-up profiling, graph capture or a long prefill; ssh dies; "
            "MemAvailable still showed many GiB a moment before",
    detect="`NVRM: ... NV_ERR_NO_MEMORY` in dmesg, the journal or a rank log since the rank's start",
    cause="GPU allocations during profiling, CUDA-graph capture, FlashInfer autotune or a long prefill exceed "
          "what `gpu_memory_utilization` budgets, and unified-memory allocations are invisible to cgroups and OOM "
          "killers, so the driver fails before anything is killed",
    fix="lower GPU_MEM_UTIL (or set KV_CACHE_MEMORY_BYTES) and MAX_NUM_BATCHED_TOKENS, drop "
        "`--enable-flashinfer-autotune`, keep `expandable_segments:False`; sample MemAvailable through the start "
        "with an abort floor; change one thing at a time",
    proof="dmesg -T | grep -E 'NV_ERR_NO_MEMORY|NVRM'; grep MemAvailable /proc/meminfo",
    signature=_sig_pool,
    source="vllm-project/vllm#56824, #46307; NVIDIA/dgx-spark-playbooks#97; bringup-anchors §5.16",
    lines=(r"NV_ERR_NO_MEMORY", r"NVRM: .*Out of memory"),
    words=(r"hard[- ]?reset|power[- ]?cycl\w*|froze|freez\w*|wedge\w*|unresponsive|ssh (dies|died|dead|stops|stopped|drops)|stops? answering|whole (host|machine|box)|rebooted (itself|on its own)",
           r"memavailable|available memory|gpu_memory_utilization|memory utili[sz]ation|\bgmu\b|unified memory|\buma\b|\d+ ?gib (still )?(free|available)",
           r"(during|at|in) (the )?(startup|start|profil\w*|graph capture|long prefill|prefill|warm-?up|kv[- ]cache)|\b(128|131|256)k\b|long (prompt|context)|autotune"),
    lab="prevented by the start's memory guard (launch/memguard.py: MemAvailable/PSI every 1.5 s, abort floor): tests/lab/test_memory_guard_lab.py::test_memory_pressure_during_a_start_aborts_it_before_the_node_stops_answering")


_MIN_PINNED_FRACTION = 0.40      # of MemTotal not available with no rank running: a failed start left it pinned


def _is_rank(p: procs.Proc) -> bool:
    return any(k in p.cmd for k in ("vllm", "VLLM::", "EngineCore", "sglang")) and "grep" not in p.cmd


def _sig_pinned(b: B.Bundle) -> list[Hit]:
    hits = []
    for node in b.nodes:
        if not b.has(node, B.PROCESSES) or not b.has(node, B.MEMINFO) or "GB10" not in b.text(node, B.GPU):
            continue                     # only unified memory pins this way (a lab host's memory is other jobs')
        if any(_is_rank(p) for p in procs.parse_ps(b.text(node, B.PROCESSES))):
            continue
        mem = system.parse_meminfo(b.text(node, B.MEMINFO))
        avail, total = mem.get("MemAvailable"), mem.get("MemTotal")
        if not avail or not total or total - avail < _MIN_PINNED_FRACTION * total:
            continue
        hits.append(Hit(node, [f"{node}: no vLLM process runs, yet {((total - avail) / 2**30):.1f} of "
                               f"{total / 2**30:.1f} GiB are not available (MemAvailable {avail / 2**30:.1f} GiB)"]))
    return hits


MEMORY_PINNED_AFTER_FAILED_START = Entry(
    "memory-pinned-after-failed-start", "Memory stays pinned after a failed start", FATAL,
    symptom="after a failed or killed start, tens of GiB stay used with no vLLM process alive; the next start fails "
            "differently, and only a reboot frees it",
    detect="on a GB10 node (`nvidia-smi -L`), no vLLM process while MemTotal - MemAvailable exceeds 40 % of "
           "MemTotal; offline: "
           "`Engine core initialization failed. Failed core proc(s): {}`",
    cause="a start that died inside the driver leaves unified memory (UVM) allocated past the process's exit, so "
          "every relaunch gets a smaller pool",
    fix="reboot the node (stopping containers does not free it); then start once with a lower GPU_MEM_UTIL and "
        "no automatic restarts (`restart: no`); a vLLM with the UMA release fix (>= 0.24, PR #45179)",
    proof="pgrep -af 'vllm|EngineCore' || grep -E 'MemTotal|MemAvailable' /proc/meminfo",
    signature=_sig_pinned,
    source="vllm-project/vllm#45179 (comment 2026-07-07); vllm/v1/engine/utils.py:1432 @ v0.32.0 (the offline "
           "symptom); Blackwellboy/model-serving-minefield#45; "
           "bringup-anchors §5.17; field-reports-2026-12 §2 #2",
    # a symptom, never high: vLLM prints it after any engine-core death at start (vllm/v1/engine/utils.py:1432 @
    # v0.32.0); the empty proc list fits memory pinned by a dead start, but a start error above it (Ray on CPU, a
    # missing interface) is its own entry and outranks it
    symptoms=(r"Engine core initialization failed\..*Failed core proc\(s\): \{\}",),
    words=(r"only (a |the )?(full )?(host )?reboot|reboot(ing)? (is the only|fixes|clears|frees|helps)|until (a |i |we )?reboot|(needs?|required?) a reboot|reboot (the|each) (node|host|box)",
           r"(memory|ram|\bgb\b|\bgib\b|uma|uvm).{0,60}(not|never|isn'?t|wasn'?t|stays?|remain\w*|still).{0,25}(freed|released|return\w*|come back|reclaimed|pinned|held|allocated|used|trapped)|leak\w*|trapped",
           r"fail\w* (start|launch|boot|load|attempt|run|init)|crash\w*|killed|ctrl[+-]c|each (retry|attempt|failed)|no process(es)? (is |are )?(left|running|alive)|nothing (is )?running"),
    lab="none: needs the driver's UVM; prevented by the stop's baseline row (\"reboot needed\") and the next start's refusal to launch into a smaller pool (launch/memguard.py; tests/unit/test_memguard.py)")


JIT_BUILD_MEMORY_WEDGE = Entry(
    "jit-build-memory-wedge", "Parallel JIT kernel builds exhausted host memory", FATAL,
    symptom="first boot: the nodes stop answering while FlashInfer/DeepGEMM kernels compile; watchdogs reset them",
    detect="the compiler killed for memory (`Killed signal terminated program cc1plus`, `'cicc' died due to "
           "signal 9`, ninja's stop with exit 137) in a rank log; ninja's `build stopped: subcommand failed` alone is a symptom (medium): any failed "
           "compile prints it",
    cause="a runtime JIT build runs one compiler per core (22 parallel nvcc jobs) on every rank at once, and the "
          "compilers share the unified pool with the loaded weights",
    fix="cap the build (`MAX_JOBS=2`, `NVCC_THREADS=1`), ship prebuilt kernels in the image or a warm node-local "
        "JIT cache, and start one rank's cold build before the others",
    proof="grep -nE 'ninja|nvcc|cicc|Killed signal|Building JIT' <rank log>; nproc",
    signature=None,
    source="tonyd2wild/DeepSeek-V4.1-Flash-vLLM-DGX-Spark README fix 2 (boot 3); field-reports-2026-12 §2 #6",
    lines=(r"Killed signal terminated program cc1plus", r"'cicc' died due to signal 9", r"FAILED: \[code=137\]",
           r"ninja: build stopped: subcommand failed[^\n]*(?:\b137\b|SIGKILL|Killed)"),
    # ninja's own stop follows any failed compile (a syntax error, a missing compiler: jit-compiler-missing), so
    # alone it is a symptom (medium); with the kill (exit 137) on its line it stays this entry's (issue 36's sixth round)
    symptoms=(r"ninja: build stopped: subcommand failed",),
    words=(r"\bjit\b|compil\w*|ninja|nvcc|cicc|build(ing)? (the )?kernels?|kernel builds?",
           r"parallel|\bjobs\b|max_jobs|\b\d{2} (jobs|processes|compilers|nvcc)",
           r"wedg\w*|froze|freez\w*|unresponsive|\boom\b|out of memory|host memory|exhaust\w*|watchdogs? reset|all (four|4|the) nodes"),
    lab="none: the lab's CPU vLLM builds no kernels")


JIT_COLD_CACHE_SLOW = Entry(
    "jit-cold-cache-slow", "First boot compiles kernels for many minutes", WARNING,
    symptom="the first start on a fresh cache sits for 10-20 minutes with no progress line; a launcher restarts it "
            "as hung",
    detect="FlashInfer / vLLM JIT build lines (`Building JIT`, `flashinfer.jit: Loading JIT ops`) in a rank log",
    cause="kernels are compiled at runtime on a cold cache (a new image, a new node, a cache on NFS), once per node",
    fix="wait it out once with a longer readiness timeout (no restart), keep the JIT cache node-local and warm "
        "(`~/.cache/flashinfer`, VLLM_CACHE_ROOT), or use an image with prebuilt kernels",
    proof="du -sh ~/.cache/flashinfer ~/.cache/vllm 2>/dev/null; grep -c 'Building JIT' <rank log>",
    signature=None,
    source="vllm-project/vllm#45179 (17-min JIT on a fresh cache); anchors-2026-12 seed B; "
           "tonyd2wild README (verify5: zero 'Building JIT')",
    lines=(r"\bBuilding JIT\b", r"flashinfer\.jit: Loading JIT ops"),
    words=(r"\bjit\b|compil\w*|building kernels|flashinfer|autotun\w*|triton|deepgemm",
           r"\b(1[0-9]|[2-9][0-9]) ?(min|mins|minutes)\b|takes? (forever|ages|a long time)|very slow (start|boot)|slow (first )?(start|boot)|looks hung",
           r"first (boot|start|launch|run)|fresh (\w+ )?(cache|install|container|image|node)|cold (\w+ )?cache|empty cache|every (restart|new container)|look(s|ed)? hung"),
    lab="none: the lab's CPU vLLM builds no kernels")


MODPROBE_MEMORY_CAP = Entry(
    "modprobe-memory-cap", "A modprobe override caps CUDA memory", DEGRADED,
    symptom="CUDA sees about half the node's memory (~62 GB of 128); the model no longer fits with settings that "
            "worked",
    detect="offline: an `/etc/modprobe.d/*nvidia*` override (e.g. `zz-nvidia-drm-override.conf`) in the text",
    cause="an nvidia module option left in /etc/modprobe.d by an earlier setup limits the memory the driver "
          "hands to CUDA",
    fix="remove or fix the override (`grep -r nvidia /etc/modprobe.d`), `sudo update-initramfs -u`, reboot, and "
        "check the total CUDA reports again",
    proof="grep -rn nvidia /etc/modprobe.d/; python3 -c 'import torch; print(torch.cuda.mem_get_info())'",
    signature=None,
    source="al-engr.com/sglang-deepseek-spark-pivot (2026-05-24), via field-reports-2026-12 §2 #5",
    lines=(r"zz-nvidia\S*override\.conf", r"/etc/modprobe\.d/\S*nvidia\S*\.conf"),
    words=(r"modprobe|/etc/modprobe\.d|override\.conf|module option|nvreg",
           r"\b(6[0-4]) ?(gb|gib)\b|half (of )?(the |its )?memory|only .{0,20}(gb|gib) (visible|available|usable)|caps?p?\w* .{0,20}(cuda|gpu) memory|limit\w* .{0,20}memory",
           r"cuda|gpu|vllm|sglang|torch|driver"),
    lab="none: no NVIDIA driver in the lab")


AUTOTUNE_BARRIER_TIMEOUT = Entry(
    "autotune-barrier-timeout", "A cold rank fell behind in FlashInfer autotune and the barrier timed out", FATAL,
    symptom="both ranks load the weights, then die at warm-up: gloo `Connection closed by peer` on one, "
            "`Application timeout caused pair closure` on the other, ~30 minutes in",
    detect="`Application timeout caused pair closure` (gloo) in a rank log",
    cause="one rank autotunes from a cold cache while the other is warm; the CPU process group's 1800 s default "
          "timeout declares the slow rank dead at the barrier after autotune",
    fix="start every rank with the same warm autotune cache (or none: `--no-enable-flashinfer-autotune`), and keep "
        "the ranks' vLLM builds identical so the cache keys match",
    proof="grep -nE 'autotune|pair closure|Connection closed by peer' <rank logs>",
    signature=None,
    source="getainode/ainode#136 (2026-09-17)",
    lines=(r"Application timeout caused pair closure",),
    words=(r"autotun\w*",
           r"(one|a|the other) (rank|node|peer|worker).{0,60}(behind|slower|cold|from scratch)|warm (cache|head|rank)|cold (cache|peer|worker|rank)",
           r"1800|barrier|gloo|pair closure|connection closed by peer"),
    lab="none: the lab's CPU vLLM does not autotune")
