"""The table of steps, and the typed record a step leaves for the later steps: one place that names them.

A step's sidecar (``steps/<id>.json``) keeps its check rows and free-form ``data`` for the report; what a later
step needs from it is its ``record`` (the key beside them), written through the step's record type and read back
through the same type. No reader looks a check row up by its name::

    step.record = NetworkRecord(...)                          # step 01's run; Step.finish writes it
    net = RunDir(run_dir).read_record(NetworkRecord)          # step 04: 01's GID index per node, typed

A record that is missing, of another version, or not valid for its type is a :class:`RecordError` naming the
step to re-run; a reader that may run without that step (``python -m runbook start`` has no 01 in its run) asks
with ``missing_ok=True`` and then gets ``None`` only when the step wrote no sidecar at all.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import RunbookError

__all__ = ["AllreducePoint", "AllreduceSweep", "BenchRecord", "DiskFree", "EngramRank", "EngramRecord",
           "EngramSource", "FabricEnd", "FabricRail", "LaunchRank", "LaunchRecord", "NetworkRecord", "PreflightNode",
           "PreflightRecord", "Record", "RecordError", "STEPS", "ServedRecord", "SmokeRecord", "StepInfo",
           "VisionToolsRecord", "WeightsCopy", "WeightsRecord", "record_from_sidecar", "record_to_sidecar",
           "step_info", "PREFLIGHT", "NETWORK", "WEIGHTS", "ENGRAM", "LAUNCH", "SMOKE", "VISION_TOOLS", "BENCH",
           "REPORT"]


class RecordError(RunbookError):
    """A later step needs a step's record and the run folder does not hold a readable one."""


class Record(BaseModel):
    """A step's facts for the steps after it. ``VERSION`` goes up when a field changes meaning or goes away,
    so a record of another version is refused (re-run the step) instead of read wrongly."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    VERSION: ClassVar[int] = 1


# -- step 00: the nodes' facts ------------------------------------------------------------------------------

class DiskFree(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    mount: str
    free_bytes: int


class PreflightNode(BaseModel):
    """One node as preflight read it."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    hostname: str = ""
    kernel: str = ""
    docker: str | None = None                 # the docker server version; None = docker did not answer
    image_id: str = ""                        # the runtime image's id on this node; "" = not present
    mem_available: int | None = None          # bytes
    mem_total: int | None = None
    disk_free: dict[str, DiskFree] = {}       # path label (weights, engram, ...) -> its filesystem's free bytes


class PreflightRecord(Record):
    """Step 00's facts for ``runbook plan --facts`` (the fit planner's node capacities) and the report (the image
    id each node holds)."""
    nodes: dict[str, PreflightNode]
    capacity: dict[str, dict[str, Any]] = {}  # node -> fit.budget.NodeCapacity.to_dict(); {} = not planned (a
                                              # server of the runbook's held the memory)


# -- step 01: the fabric ------------------------------------------------------------------------------------

class FabricEnd(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    node: str
    iface: str
    ip: str = ""
    hca: str = ""


class FabricRail(BaseModel):
    """One rail: the nodes it joins (a cable pair, or one subnet of a three-node star) and each node's end."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    index: int
    ends: tuple[FabricEnd, ...]


class AllreducePoint(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    bytes: int
    time_us: float
    busbw_gbs: float | None = None


class AllreduceSweep(BaseModel):
    """The gloo all-reduce sweep as one node measured it (smallest message first)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    node: str
    backend: str = ""
    points: tuple[AllreducePoint, ...]


class NetworkRecord(Record):
    """Step 01's facts for 04 (the GID index each rank uses) and the bench (the all-reduce latency)."""
    gid_index: dict[str, int]                 # node -> the RoCE v2 IPv4 GID index 01 resolved (none: EXPECT_RDMA=0)
    gid_common: int | None = None             # one index valid on every node, when there is one
    rails: tuple[FabricRail, ...] = ()
    allreduce: tuple[AllreduceSweep, ...] = ()     # nodes whose sweep produced figures
    nccl_busbw_gbs: float | None = None       # nccl-tests all_reduce_perf average bus bandwidth (EXPECT_GPU=1)

    def pairs(self) -> list[tuple[str, str]]:
        """The node pairs that share at least one rail."""
        out: list[tuple[str, str]] = []
        for rail in self.rails:
            nodes = [e.node for e in rail.ends]
            out += [(a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:] if (a, b) not in out]
        return out


# -- step 02: the weights ----------------------------------------------------------------------------------

class WeightsCopy(BaseModel):
    """Where the weights are on one node. ``own_copy`` False: the node reads the head's copy (WEIGHT_SYNC=nfs)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    node: str
    weights_dir: str                          # WEIGHTS_DIR / WORKER_WEIGHTS_DIR as that node resolves it
    tree: str                                 # the verified tree (config.json and the runbook's manifest)
    own_copy: bool = True


class EngramSource(BaseModel):
    """The Engram source 02 brought (ENGRAM=1 on the Sparks); the lab's is generated by 03 (``source``)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    repo: str = ""
    revision: str = ""
    files: tuple[str, ...] = ()
    paths: dict[str, str] = {}                # node -> ENGRAM_SRC_DIR
    source: str = ""                          # "" = HF_ENGRAM_REPO; else what made it (the lab fixture)


class WeightsRecord(Record):
    """Step 02's facts for a resume (which nodes must still hold a verified manifest, where) and the report (the
    revision fetched)."""
    repo: str
    revision: str
    files: int
    total_bytes: int
    layout: str                               # weights_tools.layout: local_dir | hub_cache
    mode: str                                 # WEIGHT_SYNC
    copies: tuple[WeightsCopy, ...]           # every node, rank order
    engram: EngramSource | None = None        # None = ENGRAM=0


# -- step 03: the packed Engram tables ----------------------------------------------------------------------

class EngramRank(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    node: str
    rank: int                                 # the TP rank within its pipeline stage (the file's r{rank})
    packed_dir: str                           # ENGRAM_PACKED_DIR as that node resolves it
    files: tuple[str, ...] = ()               # engram-l{L}-r{rank}of{tp}.bin this step packed or found complete
    verified: bool | None = None              # the byte-identity check over them; None = not run
    stage: int = 0                            # the node's pipeline stage (PP > 1: stage-1 nodes hold stage 0's shards)


class EngramRecord(Record):
    """Step 03's facts: which rank's packed files sit where (TP split ``tp``)."""
    enabled: bool                             # ENGRAM=1
    tp: int
    ranks: tuple[EngramRank, ...] = ()


# -- step 04: the server ------------------------------------------------------------------------------------

class LaunchRank(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    node: str
    rank: int
    headless: bool


class LaunchRecord(Record):
    """Step 04's facts for 05-07 (where the API is, which model at which context) and a resume (the fingerprint
    every rank must still run). ``base_url`` is empty when this 04 made no start (stop, status, a refusal before it)."""
    fingerprint: str
    ranks: tuple[LaunchRank, ...]
    served_model_name: str
    max_model_len: int
    base_url: str = ""                        # the head's API (http://host:port); "" = no start made
    reused_from: str = ""                     # the earlier run whose server this run reuses (runner.reuse_launch)
    server_id: str = ""                       # which start of the server (launch.server.server_id); "" = none made


# -- steps 05-07: what was measured on which server ----------------------------------------------------------

class ServedRecord(Record):
    """Which server a serve step talked to: ``server_id`` is 04's start it measured ("" = unknown: base_url given,
    or a dry run), compared with the run's final 04 record (``RunDir.evidence_of_other_servers``)."""
    base_url: str
    server_id: str

    @classmethod
    def of(cls, server, **more: Any) -> "ServedRecord":
        """From the step's ``api.server_info.ServerInfo`` (None: a dry run, no server)."""
        return cls(base_url=server.base_url if server is not None else "",
                   server_id=server.server_id if server is not None else "", **more)


class SmokeRecord(ServedRecord):
    """Step 05's."""


class VisionToolsRecord(ServedRecord):
    """Step 06's."""


class BenchRecord(ServedRecord):
    """Step 07's: also where its result is (run-relative ``raw/07_bench/bench/result.json``; "" until measured)."""
    result: str


# -- the one table of steps ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepInfo:
    id: str                                   # "04_launch": the sidecar's, the manifest's and the raw folder's name
    package: str                              # runbook.<package>
    title: str                                # what the report calls it
    record: type[Record] | None = None        # what it leaves for the later steps

    @property
    def notebook(self) -> str:
        return f"{self.id}.ipynb"

    @property
    def number(self) -> str:
        return self.id[:2]


STEPS: tuple[StepInfo, ...] = (
    StepInfo("00_preflight", "preflight", "Preflight", PreflightRecord),
    StepInfo("01_network", "network", "Network", NetworkRecord),
    StepInfo("02_weights", "weights", "Weights", WeightsRecord),
    StepInfo("03_engram", "engram", "Engram", EngramRecord),
    StepInfo("04_launch", "launch", "Launch", LaunchRecord),
    StepInfo("05_smoke", "smoke", "Smoke test", SmokeRecord),
    StepInfo("06_vision_tools", "vision_tools", "Vision and tools", VisionToolsRecord),
    StepInfo("07_bench", "bench", "Benchmark", BenchRecord),
    StepInfo("08_report", "report", "Report"),
)
PREFLIGHT, NETWORK, WEIGHTS, ENGRAM, LAUNCH, SMOKE, VISION_TOOLS, BENCH, REPORT = STEPS
SERVED_STEPS = (SMOKE, VISION_TOOLS, BENCH)      # what they measure belongs to the server 04 names (its server_id)


def step_info(key: str | type[Record]) -> StepInfo:
    """The step by id (``04_launch``), package (``launch``), number (``04``) or record type."""
    for s in STEPS:
        if key in (s.id, s.package, s.number) or (s.record is not None and key is s.record):
            return s
    raise KeyError(f"no step {key!r} in runbook.records.STEPS")


# -- in the sidecar -----------------------------------------------------------------------------------------

def record_to_sidecar(step: str, record: Record) -> dict[str, Any]:
    """The sidecar's ``record`` value; refuses a record of another step's type."""
    owner = step_info(step)
    if type(record) is not owner.record:
        raise TypeError(f"{step} writes {owner.record.__name__ if owner.record else 'no record'}, "
                        f"not {type(record).__name__}")
    return {"type": type(record).__name__, "version": record.VERSION, "fields": record.model_dump(mode="json")}


def record_from_sidecar(sidecar: dict[str, Any] | None, cls: type[Record], where: str = ""):
    """``cls`` from a sidecar's ``record``; :class:`RecordError` naming the step to re-run when there is none,
    it is of another type or version, or its fields do not validate."""
    step = step_info(cls).id
    where = where or f"steps/{step}.json"
    fix = f"re-run {step} in this run (python -m runbook run --from {step}), then this step"
    if sidecar is None:
        raise RecordError(f"{step} has no sidecar in this run, and this step needs its record",
                          observed=f"no {where}", expected=f"{where} with its {cls.__name__}", fix=fix)
    rec = sidecar.get("record")
    if not isinstance(rec, dict):
        why = ("the step ended before it wrote its record" if sidecar.get("status") not in ("passed", "reused")
               else "written by a runbook older than typed records")
        raise RecordError(f"{step}'s sidecar holds no {cls.__name__} ({why})", observed=f"{where}: no 'record'",
                          expected=f"a {cls.__name__} version {cls.VERSION}", fix=fix)
    if rec.get("type") != cls.__name__ or rec.get("version") != cls.VERSION:
        raise RecordError(f"{step}'s record is not the one this runbook reads",
                          observed=f"{where}: record {rec.get('type')} version {rec.get('version')}",
                          expected=f"{cls.__name__} version {cls.VERSION}", fix=fix)
    try:
        return cls.model_validate(rec.get("fields"))
    except ValidationError as err:
        raise RecordError(f"{step}'s {cls.__name__} does not validate", observed=f"{where}: {err}",
                          expected=f"a {cls.__name__} version {cls.VERSION}", fix=fix) from None
