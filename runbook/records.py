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

__all__ = ["AllreducePoint", "AllreduceSweep", "FabricEnd", "FabricRail", "LaunchRank", "LaunchRecord",
           "NetworkRecord", "Record", "RecordError", "STEPS", "StepInfo", "record_from_sidecar", "record_to_sidecar",
           "step_info", "PREFLIGHT", "NETWORK", "WEIGHTS", "ENGRAM", "LAUNCH", "SMOKE", "VISION_TOOLS", "BENCH",
           "REPORT"]


class RecordError(RunbookError):
    """A later step needs a step's record and the run folder does not hold a readable one."""


class Record(BaseModel):
    """A step's facts for the steps after it. ``VERSION`` goes up when a field changes meaning or goes away,
    so a record of another version is refused (re-run the step) instead of read wrongly."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    VERSION: ClassVar[int] = 1


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
    StepInfo("00_preflight", "preflight", "Preflight"),
    StepInfo("01_network", "network", "Network", NetworkRecord),
    StepInfo("02_weights", "weights", "Weights"),
    StepInfo("03_engram", "engram", "Engram"),
    StepInfo("04_launch", "launch", "Launch", LaunchRecord),
    StepInfo("05_smoke", "smoke", "Smoke test"),
    StepInfo("06_vision_tools", "vision_tools", "Vision and tools"),
    StepInfo("07_bench", "bench", "Benchmark"),
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
