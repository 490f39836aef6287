"""Issue 36 and issue 37 item 2: confident wrong names fixed, false [fatal] rows after lab-only absences and the
runbook's own stops, and the families that extract what their fix names. Each text is the real one (its source
beside it) or the runbook's own output."""
from __future__ import annotations

import json
from pathlib import Path

from runbook.diagnose import Bundle, match
from runbook.diagnose import bundle as B
from runbook.diagnose.accuracy import FROZEN_CORPUS, evaluate, load_corpus
from runbook.diagnose.offline import diagnose_text


def _first(text: str):
    ranked = diagnose_text(text)
    return ranked[0] if ranked else None


# --------------------------------------------------------------------------- three confident wrong names

def test_the_good_pinned_kernel_is_not_named_a_bad_kernel():
    # anchors-2026-12 #14: 6.17.0-1032-nvidia is the pinned, good kernel; a report that names it is not about it
    text = ("Both Sparks run the pinned kernel 6.17.0-1032-nvidia. RDMA throughput in nccl-tests is fine, but the "
            "server hangs at start.")
    assert "kernel-known-bad" not in [r.id for r in diagnose_text(text)]
    bad = "After the update to kernel 7.0.0-1019-nvidia, RDMA registration fails during autotune."
    assert _first(bad).id == "kernel-known-bad" and _first(bad).confidence != "high"


def test_a_full_disk_while_extracting_a_layer_is_not_a_dropped_download():
    # sickcodes/Docker-OSX#314 (the maintainer: out of disk space) and NVIDIA-NeMo/Speech#1029
    eof = ("auto: Pulling from sickcodes/docker-osx\na1671807670e: Extracting  19.04GB/19.04GB\n"
           "failed to register layer: Error processing tar file(exit status 1): unexpected EOF")
    ranked = diagnose_text(eof)
    assert ranked and ranked[0].id == "disk-full"
    assert ranked[0].confidence != "high", "an EOF while extracting is a symptom: never high"
    assert "docker-pull-eof" not in [r.id for r in ranked if r.confidence == "high"]
    enospc = ("docker pull nvcr.io/nvidia/nemo:v0.11\nfailed to register layer: Error processing tar file(exit status 1): "
              "write /opt/conda/lib/python3.6/site-packages/torch/lib/libtorch.so: no space left on device.")
    found = [f for f in match(Bundle(texts={"head": {B.DOCKER_PULL: enospc}})) if f.id != "disk-full"]
    assert not [f for f in found if f.id.startswith("docker-pull")], found
    disk = [f for f in match(Bundle(texts={"head": {B.DOCKER_PULL: enospc}})) if f.id == "disk-full"]
    assert disk and "/var/lib/docker" in disk[0].fix, "the fix names docker's data root, not the path inside the image"


def test_a_port_race_between_processes_is_not_the_api_port():
    # vllm-project/vllm#40443 (ZMQ) and verl-project/verl#6677 (TCPStore on a random port)
    zmq = ("(ApiServer_3 pid=2201) zmq.error.ZMQError: Address already in use (addr='tcp://10.0.0.5:41235')\n"
           "RuntimeError: Process ApiServer_3 (PID: 2201) died with exit code 1")
    store = ("(Worker pid=7181) ERROR 06-09 17:58:55 [multiproc_executor.py:852] torch.distributed.DistNetworkError: The "
             "server socket has failed to listen on any local network address. port: 32847, useIpv6: false, code: -98, "
             "name: EADDRINUSE, message: address already in use")
    for text, port in ((zmq, "41235"), (store, "32847")):
        ranked = diagnose_text(text)
        assert ranked and ranked[0].id == "port-race", [r.id for r in ranked]
        assert "api-port-in-use" not in [r.id for r in ranked]
        assert any(port in l for l in ranked[0].lines), "the raced port is extracted into the evidence"
    # the API's own bind error still names the API port
    api = "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use"
    assert _first(api).id == "api-port-in-use"


def test_a_cue_only_match_is_never_high():
    cue_only = [r for text in ("Our docker pull fails with unexpected EOF halfway through the download.",
                               "vllm serve loads the model, then exits saying port 8000 is already in use",
                               "The layer fails to register with no space left on device; df shows the disk full.")
                for r in diagnose_text(text) if not r.lines]
    assert cue_only
    assert all(r.confidence in ("low", "medium") for r in cue_only), cue_only


# --------------------------------------------------------------------------- issue 37 item 2

def _commands(*recs: dict) -> str:
    return "\n".join(json.dumps(r) for r in recs)


LAB_FIREWALL_READS = Path(__file__).parents[1] / "data" / "diagnose_issue37" / "lab_firewall_reads.jsonl"


def test_a_missing_ufw_on_the_lab_is_not_a_split_environment():
    # the lab run's own firewall reads (runbook/facts/firewall.py), copied from its commands.jsonl
    reads = LAB_FIREWALL_READS.read_text()
    assert reads.count("ufw: command not found") >= 2
    b = Bundle(texts={"head": {B.RANK_LOG: "INFO starting\n"}, "worker": {B.RANK_LOG: "INFO starting\n"},
                      B.LOCAL: {B.LOCAL_COMMANDS: reads}})
    assert "env-split-by-quoting" not in {f.id for f in match(b)}
    ufw = json.loads(reads.splitlines()[0])
    # a start command that lost its quoting is still named
    split = {"node": "worker", "command": "env VLLM_HOST_IP=10.0.0.2 VLLM_EXTRA=--foo bar setsid nohup vllm serve m",
             "exit_code": 127, "stdout_tail": "", "stderr_tail": "env: ‘bar’: No such file or directory"}
    b2 = Bundle(texts={"head": {B.RANK_LOG: "INFO starting\n"}, B.LOCAL: {B.LOCAL_COMMANDS: _commands(ufw, split)}})
    assert "env-split-by-quoting" in {f.id for f in match(b2)}


def _guard_stop_bundle(worker_log: str, docker: bool = False) -> Bundle:
    sd = "/home/u/.cache/spark-runbook/launch"
    start = {"node": "worker", "kind": "run", "exit_code": 0,
             "command": f"mkdir -p {sd} && cd {sd} || exit 1; env VLLM_HOST_IP=10.0.0.2 setsid nohup vllm serve m "
                        f"> {sd}/worker.log 2>&1 < /dev/null & echo $! > {sd}/worker.pid"}
    if docker:        # launch/render.py start_command, docker runtime
        start["command"] = (f"mkdir -p {sd} || exit 1; docker rm -f vllm-worker >/dev/null 2>&1; docker run -d "
                            f"--name vllm-worker --network host img vllm serve m")
    # runbook/launch/stop.py _stop_node: what the memory guard's abort runs once the rank is gone
    stop = {"node": "worker", "kind": "run", "exit_code": 0,
            "command": f"rm -f {sd}/worker.pid {sd}/worker.fingerprint {sd}/worker.json; true"}
    return Bundle(texts={"head": {B.RANK_LOG: "INFO Loading weights\n"},
                         "worker": {B.RANK_LOG: worker_log, B.PROCESSES: "  PID STAT CMD\n"},
                         B.LOCAL: {B.LOCAL_COMMANDS: _commands(start, stop)}})


def test_the_memory_guards_own_stop_is_not_a_dead_worker():
    stopped = _guard_stop_bundle("INFO Loading weights\nINFO received SIGTERM, shutting down\n")
    assert "worker-not-running" not in {f.id for f in match(stopped)}
    # docker runtime: the stop's `docker rm` takes the container's log along
    gone = _guard_stop_bundle("Error response from daemon: No such container: vllm-worker\n", docker=True)
    assert "worker-not-running" not in {f.id for f in match(gone)}
    died = _guard_stop_bundle("INFO Loading weights\nTraceback (most recent call last):\n"
                              "ModuleNotFoundError: No module named 'vllm._C'\n")
    assert "worker-not-running" in {f.id for f in match(died)}, "a worker that died before the stop is still named"


# --------------------------------------------------------------------------- families extract what the fix names

def test_families_extract_the_values_their_fix_names():
    kv = ("ValueError: The model's max seq len (163840) is larger than the maximum number of tokens that can be "
          "stored in KV cache (13360). Try increasing gpu_memory_utilization or decreasing max_model_len")
    f = [f for f in match(Bundle(texts={"head": {B.RANK_LOG: kv}})) if f.id == "kv-cache-below-max-model-len"]
    assert f and "13360" in f[0].fix and "163840" in f[0].fix
    shm = ("misc/shmutils.cc:112 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-KWfVyt "
           "(size 5967872)")
    f = [f for f in match(Bundle(texts={"head": {B.RANK_LOG: shm}})) if f.id == "nccl-shm-too-small"]
    assert f and "/dev/shm/nccl-KWfVyt" in f[0].fix and "5967872" in f[0].fix
    assert "disk-full" not in {x.id for x in match(Bundle(texts={"head": {B.RANK_LOG: shm}}))}
    gated = "Cannot access gated repo for url https://huggingface.co/meta-llama/Llama-3.1-8B/resolve/main/config.json."
    f = [f for f in match(Bundle(texts={"worker": {B.RANK_LOG: gated}})) if f.id == "hf-gated-repo-token"]
    assert f and "meta-llama/Llama-3.1-8B" in f[0].fix and f[0].node == "worker"
    # a CUDA OOM counts as a start-up one only after the start-up's phase lines (vllm gpu_model_runner.py:6657)
    capture = "INFO [gpu_model_runner.py:6657] Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 40%\n"
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 119.70 GiB\n"
    f = [f for f in match(Bundle(texts={"head": {B.RANK_LOG: capture + oom}})) if f.id == "cuda-oom-startup"]
    assert f and "2.00 GiB" in f[0].fix
    assert "cuda-oom-startup" not in {x.id for x in match(Bundle(texts={"head": {B.RANK_LOG: oom + capture}}))}
    # a 429 that is not a registry's (/v2/ API) is not the docker pull rate limit
    hf429 = "requests.exceptions.HTTPError: 429 Client Error: Too Many Requests for url: https://huggingface.co/api/models/x"
    assert "registry-rate-limit" not in {x.id for x in match(Bundle(texts={"head": {B.RANK_LOG: hf429}}))}
    reg429 = ("unexpected status code https://registry-1.docker.io/v2/library/rust/manifests/sha256:de6e: 429 Too Many "
              "Requests - Server message: toomanyrequests: You have reached your pull rate limit.")
    f = [x for x in match(Bundle(texts={"head": {B.DOCKER_PULL: reg429}})) if x.id == "registry-rate-limit"]
    assert f and "registry=registry-1.docker.io" in " ".join(f[0].evidence)
    ray = "rpc_client.h:153: Failed to connect to GCS at address 172.16.11.65:41000 within 5 seconds."
    f = [f for f in match(Bundle(texts={"worker": {B.RANK_LOG: ray}})) if f.id == "ray-node-not-joined"]
    assert f and "172.16.11.65:41000" in f[0].fix


def test_a_failed_start_command_says_why_in_the_command_log():
    # a `docker run --gpus` without the toolkit fails before any container (so before any rank log) exists
    run = {"node": "worker", "kind": "run", "exit_code": 125,
           "command": "mkdir -p /x || exit 1; docker rm -f vllm-worker >/dev/null 2>&1; docker run -d --gpus all img",
           "stdout_tail": "", "stderr_tail": 'docker: Error response from daemon: could not select device driver "" '
                                            "with capabilities: [[gpu]]."}
    b = Bundle(texts={"worker": {B.RANK_LOG: "Error: No such container: vllm-worker\n"},
                      B.LOCAL: {B.LOCAL_COMMANDS: _commands(run)}})
    f = [x for x in match(b) if x.id == "nvidia-container-toolkit-missing"]
    assert f and f[0].node == "worker"
    # the same pull failed once and passed on the retry: no longer a finding
    pull = {"node": "head", "kind": "run", "command": "docker pull img", "exit_code": 1, "stdout_tail": "",
            "stderr_tail": "Error response from daemon: toomanyrequests: You have reached your pull rate limit."}
    assert "registry-rate-limit" in {x.id for x in match(Bundle(texts={B.LOCAL: {B.LOCAL_COMMANDS: _commands(pull)}}))}
    retried = _commands(pull, {**pull, "exit_code": 0, "stderr_tail": ""})
    assert "registry-rate-limit" not in {x.id for x in match(Bundle(texts={B.LOCAL: {B.LOCAL_COMMANDS: retried}}))}


# --------------------------------------------------------------------------- the frozen held-out set

def test_the_frozen_held_out_set_is_loaded_and_meets_the_issue_floor():
    cases = [c for c in load_corpus() if c.split == "frozen"]
    assert FROZEN_CORPUS.is_dir() and cases
    assert {c.kind for c in cases} >= {"log", "mixed", "words"}
    report = evaluate(cases)
    cell = report.cell("frozen")
    assert cell.positives and cell.negatives
    assert cell.top1_pct() >= 70 and cell.top3_pct() >= 85, report.table()
    assert cell.false_alarms == 0 and cell.confident_wrong == 0, cell.misses
