"""What a node must be allowed or equipped to fetch and run: a gated Hugging Face repo without a token on that
node, docker without the NVIDIA container toolkit, a registry's pull rate limit, an image without the node's
architecture. Each extracts the repo, registry or platform the fix names."""
from __future__ import annotations

from .entry import FATAL, Entry, extracting

#: huggingface_hub utils/_http.py hf_raise_for_status: GatedRepoError ("Cannot access gated repo for url <url>.
#: Access to model <repo> is restricted ..." / "Repo model <repo> is gated. You must be authenticated"),
#: RepositoryNotFoundError on 401; transformers' OSError "You are trying to access a gated repo."
_GATED = (r"Cannot access gated repo for url https://huggingface\.co/(?P<repo>[\w.-]+/[\w.-]+)",
          r"(?:Repo model|Access to model) (?P<repo>[\w.-]+/[\w.-]+) is (?:gated|restricted)",
          r"GatedRepoError: 40[13]",
          r"You are trying to access a gated repo\.?(?:\s*Make sure to (?:request access|have access to it) at "
          r"https://huggingface\.co/(?P<repo>[\w.-]+/[\w.-]+))?")

HF_GATED_REPO_TOKEN = Entry(
    "hf-gated-repo-token", "A gated Hugging Face repo without a token (on that node)", FATAL,
    symptom="the download (often only on the worker) fails with `GatedRepoError: 401` / `Cannot access gated repo`",
    detect="huggingface_hub's gated-repo error in a rank log or the weights step's output; the repo is extracted",
    cause="the node that downloads has no HF_TOKEN (or one without access to the repo): the token was set on the "
          "head only, or the license was not accepted for that account",
    fix="accept the license of {repo} on huggingface.co with the token's account, and pass HF_TOKEN to every rank "
        "that downloads (or copy the weights to each node and set HF_HUB_OFFLINE=1)",
    proof="HF_TOKEN=... huggingface-cli whoami; huggingface-cli download {repo} config.json   # on the failing node",
    signature=extracting(*_GATED),
    source="huggingface/huggingface_hub src/huggingface_hub/utils/_http.py:890 @ 2.4.0 (hf_raise_for_status, "
           "GatedRepoError); symptoms: _http.py:933-952 @ 2.4.0 (a 401 is the Hub's answer for a private or gated repo "
           "without authentication and for a missing repo, raised as RepositoryNotFoundError); "
           "reports tenstorrent/tt-inference-server#37, lastmile-ai/aiconfig#1000",
    # symptoms (never high): the Hub's 401 for a file or repo URL, as huggingface_hub, requests or a Rust client
    # (hf-hub, candle) print it: no token or a token without access; a wrong repo id answers the same
    symptoms=(r"https://huggingface\.co/(?P<repo>[\w.-]+/[\w.-]+)/resolve/\S*: status code 401\b",
              r"\b401 Client Error\b[^\n]*(?:\n[^\n]*){0,3}?(?:Unauthorized|Repository Not Found) for url: "
              r"https://huggingface\.co/"),
    words=(r"gated\b.{0,20}\b(repo|model)|gatedrepoerror|accept\w* (the )?licen[cs]e|"
           r"\b(401|unauthori[sz]ed)\b.{0,60}\b(hugging ?face|hf|hf_token|the hub)\b|"
           r"\b(hugging ?face|hf|hf_token|the hub)\b.{0,60}\b(401|unauthori[sz]ed)\b",
           r"hf_token|token|401|403|unauthori[sz]ed|log ?in",
           r"worker|second node|other node|only on|rented|remote"),
    lab="none: the lab never reaches huggingface.co")

#: moby daemon/devices.go (`could not select device driver %q with capabilities: %v`): `--gpus` with no
#: registered GPU device driver (nvidia-container-toolkit not installed or docker not restarted after
#: `nvidia-ctk runtime configure`); `unknown or invalid runtime name: nvidia` when only the runtime is missing;
#: the CDI path (`--device nvidia.com/gpu=all`, podman, docker 25+): `unresolvable CDI devices <name>` from
#: tags.cncf.io/container-device-interface pkg/cdi/cache.go (InjectDevices) when no CDI spec was generated
_CTK = ((r"could not select device driver (?P<driver>\"[^\"]*\" )?with capabilities: \[\[gpu\]\]",
         {"reason": "docker has no GPU device driver registered (the toolkit is not installed, or docker was not "
                    "restarted after `nvidia-ctk runtime configure`)"}),
        (r"unknown or invalid runtime name: (?P<runtime>nvidia)",
         {"reason": "docker has no `nvidia` runtime registered (`nvidia-ctk runtime configure --runtime=docker` "
                    "was not run, or docker was not restarted)"}),
        (r"unresolvable CDI devices (?P<device>[\w./-]+=[\w,-]+)",
         {"reason": "no CDI spec names the device (run `sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`; "
                    "`nvidia-ctk cdi list` must list it)"}),
        # the toolkit's own hook (libnvidia-container src/cli/configure.c:226 @ 09df17a2, configure_command:
        # warnx("initialization error: %s", nvc_error(nvc)) after nvc_init; the same for detection/mount/ldcache/
        # requirement errors): the toolkit is installed but cannot set up the GPU; the reason is what nvc_init said
        # NVML's own driver answers wrapped by the hook (driver not loaded, driver/library version mismatch, NVML not
        # loadable) are the driver entries' (driver-not-loaded, nvml-driver-library-mismatch): not this one's
        # a CUDA image's own requirement (NVIDIA_REQUIRE_CUDA=cuda>=X) the driver does not meet is the image's CUDA
        # being newer than the driver: cuda-toolchain-newer-than-driver, not the toolkit
        r"nvidia-container-cli: (?P<stage>initialization|detection|mount|ldcache|requirement|container|device|permission) "
        r"error: (?!nvml error: driver|load library failed: libnvidia-ml|unsatisfied condition: cuda\s*>)"
        r"(?P<reason>[^\n\\\"]{3,160}?)(?=\\|\"|: unknown|\.?\s*$)")

NVIDIA_CONTAINER_TOOLKIT_MISSING = Entry(
    "nvidia-container-toolkit-missing", "docker cannot give the container a GPU (NVIDIA container toolkit missing or "
    "failing)", FATAL,
    symptom="`docker run --gpus ...` fails at once: `could not select device driver \"\" with capabilities: [[gpu]]`, "
            "`unknown or invalid runtime name: nvidia`, or the toolkit's hook says `nvidia-container-cli: "
            "initialization error: ...`",
    detect="docker's `could not select device driver ... with capabilities: [[gpu]]` or `unknown or invalid runtime "
           "name: nvidia`, CDI's `unresolvable CDI devices <name>`, or the toolkit hook's own `nvidia-container-cli: "
           "<stage> error: <reason>`; the stage and reason are extracted",
    cause="the NVIDIA container toolkit is not installed on that node or docker was not restarted after it was "
          "configured (a snap-installed docker does not see it); or the toolkit is there but its hook cannot set up "
          "the GPU (it names why: a driver RPC error, a failed mount, a requirement the driver does not meet; NVML's "
          "own driver errors it wraps are the driver entries')",
    fix="what failed on that node: {reason}. Install nvidia-container-toolkit if `dpkg -l nvidia-container-toolkit` lacks it, run "
        "`sudo nvidia-ctk runtime configure --runtime=docker` and `sudo systemctl restart docker` (docker from apt, "
        "not snap); `nvidia-smi` must work on the host first; check with `docker run --rm --gpus all <image> "
        "nvidia-smi`",
    proof="dpkg -l nvidia-container-toolkit; docker info | grep -i runtimes; nvidia-container-cli -k -d /dev/tty info",
    signature=extracting(*_CTK),
    source="moby/moby daemon/devices.go (could not select device driver); NVIDIA/libnvidia-container "
           "src/cli/configure.c:226 @ 09df17a2 (`initialization error: %s` after nvc_init); container-device-interface "
           "pkg/cdi/cache.go (unresolvable CDI devices); reports mayooot/grok-docker#2, "
           "NVIDIA/nvidia-container-toolkit#556 (driver rpc error), NVIDIA/nvidia-docker#1780 (cannot open shared "
           "object file), NVIDIA/nvidia-container-toolkit#146 (unresolvable CDI devices)",
    words=(r"could not select device driver|nvidia-container-toolkit|container toolkit|nvidia-ctk|--gpus|"
           r"nvidia-container-cli|nvidia container runtime|nvidia-docker|gpus? (is |are )?not (visible|available|"
           r"found|detected) (in|inside) (the |my |a )?(docker|container)|"
           r"(docker|container) (can'?t|cannot|does ?n[o']t) (see|find|detect|access) (the |my |any )?gpus?",
           r"docker|container|\[\[gpu\]\]|runtime|nvidia-smi"),
    lab="none: the lab's containers run without GPUs")

#: the registry's TOOMANYREQUESTS error code (distribution/distribution registry/api/errcode, HTTP 429), as
#: docker prints it: "toomanyrequests: You have reached your pull rate limit ..."
_RATE = (r"toomanyrequests: (?P<message>[^\n]{0,120})",
         # a 429 from a registry's API (/v2/...), not any 429 (Hugging Face's own limit needs another fix)
         r"https?://(?P<registry>[\w.-]+)/v2/\S*?:? 429 Too Many Requests")

REGISTRY_RATE_LIMIT = Entry(
    "registry-rate-limit", "The registry's pull rate limit was reached", FATAL,
    symptom="`docker pull` fails with `toomanyrequests: You have reached your pull rate limit`",
    detect="the registry's `toomanyrequests` / HTTP 429 in docker pull output",
    cause="anonymous (or free-tier) pulls from that registry are rate limited per IP; several nodes behind one "
          "address pull the same large image",
    fix="`docker login` to the registry on every node (authenticated pulls have a higher limit), pull once and "
        "ship the image to the other nodes (`docker save | ssh <node> docker load`), or use a mirror; waiting "
        "resets the limit",
    proof="docker pull {image} 2>&1 | tail -3",
    signature=extracting(*_RATE),
    source="distribution/distribution registry/api/errcode (TOOMANYREQUESTS); docker-pull classification "
           "runbook/facts/docker_pull.py (rate-limit)",
    words=(r"rate[- ]limit\w*|toomanyrequests|too many requests|\b429\b",
           r"docker|pull\w*|registry|hub|ghcr|nvcr"),
    lab="none yet: the lab registry stub answering 429 would produce it")

#: moby distribution (`no matching manifest for %s in the manifest list entries`), containers/image (`no image
#: found in image index for architecture ...`), the docker CLI's platform warning, and the kernel's ENOEXEC when
#: an amd64 binary runs on arm64 (`exec format error`)
_ARCH = (r"no matching manifest for (?P<platform>[\w/]+)(?: in the manifest list entries)?",
         r"no image found in image index for architecture \"?(?P<platform>[\w]+)\"?",
         r"The requested image's platform \((?P<image_platform>[\w/]+)\) does not match the detected host platform "
         r"\((?P<platform>[\w/]+)\)",
         r"image platform \((?P<image_platform>[\w/]+)\) does not match the expected platform \((?P<platform>[\w/]+)\)",
         r"exec (?P<binary>/\S+): exec format error",
         r"`?(?P<binary>/[^\s:`]+)`?: Exec format error",
         # containerd core/images/handlers.go LimitManifests @ 0556f45c (`no match for platform in manifest`, ErrNotFound): a pull or a
         # BuildKit FROM of an image with no manifest for the host's platform
         r"(?:pull and unpack image \\?\"?(?P<image>[^\s\"\\]+?)\\?\"?: )?no match for platform in manifest",
         # runc's init (libcontainer/standard_init_linux.go:228 @ v1.0.0, `exec user process caused: %w` before v1.1; the Go
         # runtime's ENOEXEC text): the image's entrypoint is a binary of another architecture
         r"standard_init_linux\.go:\d+: exec user process caused:? \\?\"?exec format error")

def _arch_what(pattern: str) -> str:
    """What an architecture message says happened, for the fix."""
    if "exec" in pattern.lower():
        return "the node executed a binary built for another architecture"
    if "does not match" in pattern:
        return "the image pulled is built for another platform"
    return "the registry has no manifest for it"


IMAGE_ARCH_MISMATCH = Entry(
    "image-arch-mismatch", "The image has no build for the node's architecture", FATAL,
    symptom="the pull fails with `no matching manifest for linux/arm64/v8`, or the container exits at once with "
            "`exec format error`",
    detect="`no matching manifest for <platform>`, `no image found in image index for architecture`, containerd's "
           "`no match for platform in manifest`, docker's platform-mismatch warning or `exec format error` (runc's "
           "`exec user process caused`); the platform, the image and the binary are extracted",
    cause="the image (tag) is built for linux/amd64 only, while a DGX Spark is linux/arm64 (aarch64)",
    fix="the image has no build for {platform} ({what}); use an image built for linux/arm64 (the Spark recipes' "
        "images, NGC's arm64 tags), or build one on the node; check with `docker manifest inspect {image}` that it "
        "lists linux/arm64",
    proof="docker manifest inspect {image} | grep -A2 platform; uname -m",
    signature=extracting(*[(p, {"platform": "linux/arm64", "what": _arch_what(p)}) for p in _ARCH]),
    source="moby/moby distribution/pull_v2.go (no matching manifest); containers/image (no image found in image "
           "index); containerd core/images/handlers.go LimitManifests @ 0556f45c (no match for platform in manifest); opencontainers/runc "
           "libcontainer/standard_init_linux.go:228 @ v1.0.0 (newSystemErrorWithCause(err, \"exec user process\"); from v1.1 the "
           "error reads `exec <path>: exec format error`); tuning report "
           "vllm-project/vllm#30076; reports BaptisteBdn/docker-selfhosted-apps#3 (arm64 board, amd64 image), "
           "NVIDIA/nvidia-docker#1116 (nvidia/cuda on Jetson: not multi-arch)",
    words=(r"exec format error|no matching manifest|no match for platform|(platform|architecture) (\w+ )?(does not|doesn'?t) match|"
           r"wrong (architecture|platform)|(only|no) (an? )?(arm64|amd64|aarch64|x86[_-]64) (image|build|tag|variant|manifest)|"
           r"only (has|have|ships|provides|publishes|offers) (an? )?(amd64|x86[_-]64|x86) (image|build|tag|variant|manifest)|"
           r"not (built|available|published) for (arm64|aarch64|amd64|arm)|"
           r"(image|container|tag) (is |was )?(built )?(only )?for (x86[_-]64|amd64|x86)\b|"
           r"(x86[_-]64|amd64|x86)[- ]only (image|build|tag|container)|"
           r"(doesn'?t|does not|won'?t) (support|run on) (arm64|aarch64|arm)\b",
           r"arm64|aarch64|amd64|x86[_-]64",
           r"image|docker|container|manifest|pull\w*"),
    lab="none: the lab is one architecture")
