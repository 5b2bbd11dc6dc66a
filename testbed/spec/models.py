"""Typed, frozen scenario spec objects (pydantic v2); cross-field checks live in check.py."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from testbed import names
from testbed.catalog import GPUS

PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]

# Every number that reaches a timer, a sleep or a loop has a finite upper bound (docs/
# security.md, "Numbers and strings"): Python's timers refuse more than ~9.2e9 s
# (threading.TIMEOUT_MAX) with an OverflowError, and a loop over an unbounded count
# never ends. These are far beyond any real scenario.
MAX_EVENT_AT_S = 1e9
"""Latest event time, scenario seconds (about 31 years)."""
MAX_FAULT_S = 86_400.0
"""Longest down_s and period_s of a fault, scenario seconds (one day)."""
MAX_EVENTS = 1000
"""Most entries in a scenario's `events`."""
MAX_DURATION_S = 1e9
"""Largest mean time (holding, inter-arrival) of a generated workload, seconds."""


def _checked(regex, what):  # type: ignore[no-untyped-def]
    def validate(value: str) -> str:
        return names.check(regex, value, what)

    return validate


class Frozen(BaseModel):
    """Base: immutable, unknown keys rejected, strict types (no true for 1, no "5" for 5)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


NodeName = Annotated[str, Field(min_length=1, max_length=32)]
DCName = Annotated[str, Field(min_length=1, max_length=15)]


class LinkSpec(Frozen):
    """One fibre of an explicit topology."""

    u: NodeName
    v: NodeName
    length_km: Annotated[float, Field(gt=0, le=40000, allow_inf_nan=False)]

    @field_validator("u", "v", mode="before")
    @classmethod
    def _node_ids(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str):
            names.check(names.NODE_NAME_RE, value, "node id")
        return value

    @model_validator(mode="after")
    def _no_self_loop(self) -> LinkSpec:
        if self.u == self.v:
            raise ValueError(f"self-loop {self.u}-{self.v}")
        return self


class TopologySpec(Frozen):
    """Either a library topology, a CSV file, or explicit nodes and links."""

    library: str | None = None
    file: str | None = None
    nodes: list[NodeName] | None = None
    links: list[LinkSpec] | None = None

    @field_validator("nodes", mode="before")
    @classmethod
    def _node_list(cls, value: object) -> object:
        if isinstance(value, list):
            value = [str(v) if isinstance(v, int) and not isinstance(v, bool) else v
                     for v in value]
            for v in value:
                if isinstance(v, str):
                    names.check(names.NODE_NAME_RE, v, "node id")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> TopologySpec:
        given = [k for k in ("library", "file", "links") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of library, file, or links (+ optional nodes)")
        if self.nodes is not None and self.links is None:
            raise ValueError("nodes is only used together with links")
        if self.links is not None and not self.links:
            raise ValueError("empty topology: links must not be empty")
        return self


class DCSpec(Frozen):
    """A datacenter attached to an optical node."""

    name: DCName
    node: NodeName
    gpus: Annotated[int, Field(ge=1, le=1_000_000)]
    gpu: str = "h100"
    price_usd_per_kwh: NonNegFloat = 0.10
    price_curve_usd_per_kwh: list[NonNegFloat] | None = Field(
        default=None, description="24 hourly prices (local time = simulation hour mod 24)"
    )
    hosts: Annotated[int, Field(ge=1, le=64)] | None = Field(
        default=None, description="emulated hosts in this DC (default: emulation.hosts_per_dc)"
    )
    fabric_gbps: PositiveFloat = Field(
        default=400.0, description="intra-DC fabric bandwidth between two pipeline stages "
        "placed in this DC (Gb/s per stage boundary)")
    fabric_latency_ms: NonNegFloat = Field(
        default=0.005, description="intra-DC one-way latency between two stages (ms)")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return names.check(names.DC_NAME_RE, value, "DC name")

    @field_validator("node", mode="before")
    @classmethod
    def _node_id(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        if value not in GPUS:
            raise ValueError(f"unknown GPU type {value!r} (known: {', '.join(GPUS)})")
        return value

    @field_validator("price_curve_usd_per_kwh")
    @classmethod
    def _curve_24(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and len(value) != 24:
            raise ValueError(f"needs 24 hourly prices, got {len(value)}")
        return value


class ModulationSpec(Frozen):
    """A modulation format: maximum reach and capacity per 12.5 GHz slot."""

    name: Annotated[str, Field(min_length=1, max_length=16, pattern=r"^[A-Za-z0-9_-]+$")]
    reach_km: PositiveFloat
    gbps_per_slot: PositiveFloat
    required_gsnr_db: Annotated[float, Field(ge=-10, le=50, allow_inf_nan=False)] | None = Field(
        default=None,
        description="GSNR (dB, signal bandwidth) the format needs under qot: gnpy; default: "
        "the built-in table for BPSK, QPSK, 8QAM, 16QAM, 32QAM, 64QAM (docs/optical.md)",
    )


class OpticalSpec(Frozen):
    """The optical layer: flex grid (slots) or fixed grid (wavelengths)."""

    grid: Literal["flex", "fixed"] = "flex"
    slots: Annotated[int, Field(ge=1, le=4096)] = 80
    slot_ghz: PositiveFloat = 12.5
    guard_slots: Annotated[int, Field(ge=0, le=16)] = 0
    k_paths: Annotated[int, Field(ge=1, le=32)] = 3
    modulations: Literal["default"] | list[ModulationSpec] = "default"
    wavelengths: Annotated[int, Field(ge=1, le=4096)] | None = None
    gbps_per_wavelength: PositiveFloat | None = None
    spectrum_sharing: Literal["shared", "per_direction"] = Field(
        default="shared",
        description="shared: one spectrum per link for both directions (RMSA convention); "
        "per_direction: one fibre per direction",
    )
    propagation_us_per_km: PositiveFloat = 5.0
    node_delay_ms: NonNegFloat = 0.0
    # Quality of transmission (testbed/optical/qot.py, docs/optical.md "QoT from GNPy").
    qot: Literal["reach", "gnpy"] = Field(
        default="reach",
        description="reach: format by length from the reach table; gnpy: by the GSNR GNPy "
        "computes for the path (flex grid only)",
    )
    # at least 10 km: GNPy's cost grows with the spans (a 40,000 km link: 4,000 spans)
    span_length_km: Annotated[float, Field(ge=10, le=150, allow_inf_nan=False)] = 80.0
    fiber_type: Literal["SSMF", "NZDF", "LOF"] = "SSMF"
    fiber_loss_db_per_km: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.2
    edfa_noise_figure_db: Annotated[float, Field(ge=3, le=20, allow_inf_nan=False)] | None = \
        Field(default=None, description="None: GNPy's design picks variable-gain EDFAs from "
              "its example equipment (NF from gain); a number: every EDFA has this NF")
    launch_power_dbm: Annotated[float, Field(ge=-20, le=20, allow_inf_nan=False)] | None = \
        Field(default=None, description="per-channel launch power; None: GNPy's SI power_dbm")
    gsnr_margin_db: Annotated[float, Field(ge=0, le=30, allow_inf_nan=False)] = 2.0

    @field_validator("qot")
    @classmethod
    def _qot_grid(cls, value: str, info: ValidationInfo) -> str:
        if value == "gnpy" and info.data.get("grid") == "fixed":
            raise ValueError("qot: gnpy needs grid: flex (a fixed grid has no modulation "
                             "formats to choose)")
        return value

    @model_validator(mode="after")
    def _grid_fields(self) -> OpticalSpec:
        if self.grid == "fixed":
            if self.wavelengths is None or self.gbps_per_wavelength is None:
                raise ValueError("fixed grid needs wavelengths and gbps_per_wavelength")
        elif self.wavelengths is not None or self.gbps_per_wavelength is not None:
            raise ValueError("wavelengths/gbps_per_wavelength belong to grid: fixed")
        if isinstance(self.modulations, list):
            if not self.modulations:
                raise ValueError("modulations: list must not be empty")
            seen = [m.name for m in self.modulations]
            if len(set(seen)) != len(seen):
                raise ValueError("modulations: duplicate names")
            if self.qot == "gnpy":
                from testbed.catalog import REQUIRED_GSNR_DB

                for m in self.modulations:
                    if m.required_gsnr_db is None and m.name not in REQUIRED_GSNR_DB:
                        raise ValueError(f"modulations: format {m.name!r} needs required_gsnr_db "
                                         "under qot: gnpy (built in: "
                                         f"{', '.join(REQUIRED_GSNR_DB)})")
        return self


class LightpathRequestsWorkload(Frozen):
    """Classic dynamic RMSA traffic: Poisson arrivals, exponential holding times."""

    kind: Literal["lightpath_requests"]
    load_erlang: Annotated[float, Field(gt=0, le=1e9, allow_inf_nan=False)] = 50.0
    mean_holding_s: Annotated[float, Field(gt=0, le=MAX_DURATION_S, allow_inf_nan=False)] = 1.0
    requests: Annotated[int, Field(ge=1, le=100_000_000)] = 10_000
    bitrate_gbps: list[PositiveFloat] = Field(default_factory=lambda: [100.0, 200.0, 400.0])
    endpoints: Literal["all_nodes", "dcs"] = "all_nodes"
    trace: str | None = Field(default=None, description="CSV of requests instead of Poisson")
    seed: int = 1

    @field_validator("bitrate_gbps")
    @classmethod
    def _nonempty(cls, value: list[float]) -> list[float]:
        if not value:
            raise ValueError("must list at least one bitrate")
        return value


class ModelSpec(Frozen):
    """A custom model architecture added to the catalogue by the spec."""

    name: Annotated[str, Field(pattern=names.KEY_RE.pattern)]
    layers: Annotated[int, Field(ge=1, le=10_000)]
    hidden: Annotated[int, Field(ge=1, le=1_000_000)]
    seq_len: Annotated[int, Field(ge=1, le=10_000_000)]
    micro_batch: Annotated[int, Field(ge=1, le=65_536)] = 1
    bytes_per_value: Annotated[int, Field(ge=1, le=8)] = 2
    heads: Annotated[int, Field(ge=1, le=4096)] = 32
    ffn_hidden: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    vocab: Annotated[int, Field(ge=1, le=10_000_000)] = 50257


class JobTemplate(Frozen):
    """One kind of pipeline job in the generated mix."""

    model: str
    stages: Annotated[int, Field(ge=1, le=1024)] = 4
    gpus_per_stage: Annotated[int, Field(ge=1, le=65_536)] = 8
    microbatches: Annotated[int, Field(ge=1, le=100_000)] = 8
    iterations: Annotated[int, Field(ge=1, le=100_000_000)] = 100
    weight: Annotated[float, Field(gt=0, le=1e9, allow_inf_nan=False)] = 1.0


class PPJobsWorkload(Frozen):
    """Pipeline-parallel training jobs: a Poisson generator over a mix, or a trace file."""

    kind: Literal["pp_jobs"]
    jobs: Annotated[int, Field(ge=1, le=10_000_000)] = 100
    mean_interarrival_s: Annotated[float, Field(gt=0, le=MAX_DURATION_S,
                                                allow_inf_nan=False)] = 600.0
    mix: list[JobTemplate] = Field(default_factory=list)
    trace: str | None = Field(default=None, description="job trace CSV (see docs/traces.md)")
    models: list[ModelSpec] = Field(default_factory=list, description="extra catalogue entries")
    max_stages_per_dc: Annotated[int, Field(ge=1, le=1024)] | None = Field(
        default=None, description="most stages of one job in one DC (1: every stage in a "
        "different DC, the cross-domain setting of CBA); None: no limit")
    seed: int = 1

    @model_validator(mode="after")
    def _mix_or_trace(self) -> PPJobsWorkload:
        if self.trace is None and not self.mix:
            raise ValueError("give a job mix (at least one template) or a trace file")
        return self


class AllreduceJobSpec(Frozen):
    """One ring all-reduce job: its member hosts in ring order, buffer and iterations."""

    members: Annotated[list[Annotated[str, Field(min_length=1, max_length=64)]],
                       Field(min_length=2, max_length=64)] = Field(
        description="emulated host names in ring order, e.g. dc-a-h0 (member i sends to i+1)")
    buffer_bytes: Annotated[int, Field(ge=1024, le=1 << 30)] = Field(
        default=4 << 20, description="all-reduced tensor size (bytes)")
    iterations: Annotated[int, Field(ge=1, le=1000)] = 3

    @model_validator(mode="after")
    def _distinct(self) -> AllreduceJobSpec:
        if len(set(self.members)) != len(self.members):
            raise ValueError("members: a host appears twice")
        return self


class AllreduceJobsWorkload(Frozen):
    """Concurrent ring all-reduce jobs routed through a DC fabric, one run per policy."""

    kind: Literal["allreduce_jobs"]
    jobs: Annotated[list[AllreduceJobSpec], Field(min_length=1, max_length=32)]
    policies: Annotated[list[Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,31}$")]],
                        Field(min_length=1, max_length=8)] = Field(
        default_factory=lambda: ["ecmp", "greedy"],
        description="routing policies (testbed.routing) to run the jobs under, in turn")
    seed: int = 1

    @model_validator(mode="after")
    def _disjoint(self) -> AllreduceJobsWorkload:
        seen: dict[str, int] = {}
        for i, job in enumerate(self.jobs):
            for m in job.members:
                if m in seen:
                    raise ValueError(f"jobs[{i}]: host {m} is in jobs[{seen[m]}] too "
                                     "(one rank per host)")
                seen[m] = i
        if len(set(self.policies)) != len(self.policies):
            raise ValueError("policies: duplicate names")
        return self


Workload = Annotated[LightpathRequestsWorkload | PPJobsWorkload | AllreduceJobsWorkload,
                     Field(discriminator="kind")]

SPECTRUM_POLICIES = ("first_fit", "last_fit", "random_fit", "best_fit")
PLACEMENT_POLICIES = ("sp-ff", "sp-ff-best", "delay-first", "delay-first-best", "cost-first",
                      "cba", "cba-no-cb", "cba-k1", "cba-no-search", "cba-ilp", "bace-pipe",
                      "bace-pipe-fifo", "bace-pipe-no-path", "bace-pipe-no-cost", "joint")
ROUTING_POLICIES = ("ecmp", "shortest", "edge-coloring", "greedy", "greedy-ls", "sa", "ilp")


PROTECTION_SCHEMES = ("none", "restoration", "1+1", "backup")
MAX_TIMEOUT_S = 604_800.0
"""Longest collective time-out and restart, scenario seconds (a week)."""


class ProtectionSpec(Frozen):
    """What a pp_jobs job's lightpath gets when a fibre or slot event hits it (docs/faults.md)."""

    scheme: Literal["none", "restoration", "1+1", "backup"] = Field(
        default="restoration", description="none: the lightpath stays down until the fibre "
        "is repaired; restoration: re-routed at the cut on the k paths (restoration_s "
        "later it carries traffic); 1+1: a link-disjoint standby lightpath held from the "
        "start, switched to in switch_s; backup: a pre-planned, reserved disjoint "
        "lightpath, brought into service in restoration_s")
    restoration_s: Annotated[float, Field(ge=0, le=MAX_FAULT_S, allow_inf_nan=False)] = Field(
        default=0.025, description="restoration / backup: seconds from the cut until the new "
        "route carries traffic (default: LightPipe's SDN controller as measured, 12-31 ms)")
    switch_s: Annotated[float, Field(ge=0, le=MAX_FAULT_S, allow_inf_nan=False)] = Field(
        default=0.01, description="1+1: seconds from the cut until the receiver takes the "
        "standby path")


class WorkersFaultSpec(Frozen):
    """How the pipeline workers live through a network outage (both backends)."""

    collective_timeout_s: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S,
                                                 allow_inf_nan=False)] | None = Field(
        default=None, description="seconds a blocked send/recv/collective waits before it "
        "raises (torch.distributed init_process_group timeout); null: torch's gloo default, "
        "1800 s (NCCL's is 600 s)")
    on_fault: Literal["fail", "retry"] = Field(
        default="fail", description="after a time-out: fail the job (torch's behaviour), or "
        "retry: abort the process group, rendezvous again and redo the interrupted "
        "iteration (TorchElastic-style restart)")
    restart_s: Annotated[float, Field(ge=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)] = Field(
        default=30.0, description="retry: seconds from the time-out (or the network's "
        "return, if later) until the restarted group runs again")
    max_restarts: Annotated[int, Field(ge=0, le=1000)] = Field(
        default=3, description="retry: restarts allowed per job, then it fails (torchrun's "
        "--max-restarts, whose default is 0)")
    transport: Literal["tcp", "ideal"] = Field(
        default="tcp", description="tcp: traffic resumes at the first retransmission after "
        "the path is back (RTO doubling from rto0 = RTT + tcp_rto_min_s, at most 120 s, "
        "given up after 15 retransmissions); ideal: the instant the path is back")
    tcp_rto_min_s: Annotated[float, Field(ge=0, le=60, allow_inf_nan=False)] = Field(
        default=0.2, description="the minimum TCP retransmission time-out (Linux TCP_RTO_MIN, "
        "200 ms), scenario seconds")


class PolicySpec(Frozen):
    """Which policies decide spectrum, placement, admission and the pipeline schedule."""

    spectrum: Literal["first_fit", "last_fit", "random_fit", "best_fit"] = "first_fit"
    placement: Literal["sp-ff", "sp-ff-best", "delay-first", "delay-first-best", "cost-first",
                       "cba", "cba-no-cb", "cba-k1", "cba-no-search", "cba-ilp", "bace-pipe",
                       "bace-pipe-fifo", "bace-pipe-no-path", "bace-pipe-no-cost",
                       "joint"] = "sp-ff"
    admission: Literal["block", "queue"] = "block"
    queue: Literal["auto", "fifo", "priority"] = Field(
        default="auto", description="pp_jobs, queue admission: the waiting-job discipline; "
        "auto = the placement policy's own (priority for bace-pipe, delay-first-best, joint; "
        "else FIFO with head-of-line blocking)")
    schedule: Literal["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "crosspipe-greedy",
                      "crosspipe-opt", "geopipe"] = "1f1b"
    fixed_slots: Annotated[int, Field(ge=1, le=4096)] = Field(
        default=4, description="pp_jobs: slots per lightpath for the fixed-count baselines "
        "(sp-ff, cost-first), guard slots excluded")
    max_slots: Annotated[int, Field(ge=1, le=4096)] = Field(
        default=16, description="pp_jobs: most slots one stage-boundary lightpath may take")
    mfu: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = Field(
        default=0.4, description="pp_jobs: model FLOPs utilisation of every stage")
    ilp_time_limit_s: Annotated[float, Field(gt=0, le=86_400, allow_inf_nan=False)] = Field(
        default=5.0, description="pp_jobs cba-ilp: HiGHS time limit per job (s, at most "
        "one day)")
    routing: Literal["ecmp", "shortest", "edge-coloring", "greedy", "greedy-ls", "sa",
                     "ilp"] = Field(
        default="ecmp", description="how flows are routed over multi-path DC fabrics "
        "(emulation.dc_fabric: leaf_spine); see docs/routing.md")
    protection: ProtectionSpec = Field(default_factory=ProtectionSpec)
    workers: WorkersFaultSpec = Field(default_factory=WorkersFaultSpec)


# Which optional fields each event kind needs (all of them) and takes (no others).
EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "fiber_cut": ("link",),
    "fiber_repair": ("link",),
    "wavelength_loss": ("link", "first_slot", "slots"),
    "wavelength_repair": ("link", "first_slot", "slots"),
    "link_flap": ("link", "period_s", "count"),
    "prometheus_kill": ("down_s",),
    "controller_kill": ("down_s",),
    "worker_kill": ("job", "stage"),
}
EVENT_OPTIONAL = ("link", "first_slot", "slots", "period_s", "count", "down_s", "job", "stage")


class EventSpec(Frozen):
    """An event at a time: a fibre cut or repair, loss of a block of slots, a flapping
    fibre, or a fault of the testbed itself (its Prometheus, SDN controller or a worker
    killed)."""

    at_s: Annotated[float, Field(ge=0, le=MAX_EVENT_AT_S, allow_inf_nan=False)]
    kind: Literal["fiber_cut", "fiber_repair", "wavelength_loss", "wavelength_repair",
                  "link_flap", "prometheus_kill", "controller_kill", "worker_kill"]
    link: Annotated[list[NodeName], Field(min_length=2, max_length=2)] | None = None
    first_slot: Annotated[int, Field(ge=0, le=4095)] | None = None
    slots: Annotated[int, Field(ge=1, le=4096)] | None = None
    period_s: Annotated[float, Field(gt=0, le=MAX_FAULT_S, allow_inf_nan=False)] | None = Field(
        default=None, description="link_flap: one down/up cycle (down for period_s / 2), "
        "on the scenario clock like at_s (at most one day)")
    count: Annotated[int, Field(ge=1, le=1000)] | None = Field(
        default=None, description="link_flap: how many down/up cycles")
    down_s: Annotated[float, Field(gt=0, le=MAX_FAULT_S, allow_inf_nan=False)] | None = Field(
        default=None, description="prometheus_kill / controller_kill: seconds (scenario "
        "clock) until the run's Prometheus / SDN controller is restarted (at most one day)")
    job: int | str | None = Field(
        default=None, description="worker_kill: the job, as an index into the run's "
        "emulated jobs (0 = first) or its name in the run's records (e.g. job0)")
    stage: Annotated[int, Field(ge=0, le=1023)] | None = Field(
        default=None, description="worker_kill: the pipeline stage whose worker is killed")

    @field_validator("link", mode="before")
    @classmethod
    def _ids(cls, value: object) -> object:
        if isinstance(value, list):
            return [str(v) if isinstance(v, int) and not isinstance(v, bool) else v
                    for v in value]
        return value

    @field_validator("job", mode="before")
    @classmethod
    def _job(cls, value: object) -> object:
        if value is None or (isinstance(value, int) and not isinstance(value, bool)
                             and 0 <= value <= 1024):
            return value
        if isinstance(value, str):
            return names.check(names.NODE_NAME_RE, value, "job name")
        raise ValueError(f"must be a job index 0..1024 or a job name, got {value!r}")

    @model_validator(mode="after")
    def _kind_fields(self) -> EventSpec:
        wanted = EVENT_FIELDS[self.kind]
        missing = [f for f in wanted if getattr(self, f) is None]
        if missing:
            raise ValueError(f"{self.kind} needs {' and '.join(missing)}")
        extra = [f for f in EVENT_OPTIONAL if f not in wanted and getattr(self, f) is not None]
        if extra:
            raise ValueError(f"{self.kind} takes no {'/'.join(extra)}")
        return self

    @property
    def target(self) -> str:
        """What the event hits, in words: a fibre u-v, prometheus, or job/stage."""
        if self.link is not None:
            return "-".join(self.link)
        if self.kind == "worker_kill":
            return f"job {self.job} stage {self.stage}"
        return "controller" if self.kind == "controller_kill" else "prometheus"


class LeafSpineSpec(Frozen):
    """The 2-layer leaf-spine fabric inside every DC when emulation.dc_fabric is leaf_spine."""

    spines: Annotated[int, Field(ge=1, le=64)] = 2
    leaves: Annotated[int, Field(ge=1, le=64)] = 2
    hosts_per_leaf: Annotated[int, Field(ge=1, le=64)] | None = Field(
        default=None, description="hosts on each leaf (default: the DC's hosts spread "
        "evenly over the leaves)")
    host_link_gbps: PositiveFloat = Field(default=100.0, description="real host-leaf rate")
    spine_link_gbps: PositiveFloat = Field(default=100.0, description="real leaf-spine rate")


TimeFactor = Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]


class EmulationSpec(Frozen):
    """How real rates and times map onto what one machine can carry."""

    bandwidth_divisor: Annotated[float, Field(ge=1, le=1e9, allow_inf_nan=False)] = Field(
        default=1000.0, description="emulated link rate = real rate / bandwidth_divisor"
    )
    time_factor: TimeFactor | Literal["auto"] = Field(
        default="auto", description="emulated delay and compute time = real time x "
        "time_factor; auto: before the workload the run measures each lightpath's "
        "processing time and the workers' compute under load and picks the smallest "
        "factor that keeps every DC pair's RTT within 2 x delay +- 1 ms and compute within "
        "5 % in scenario time (testbed.emu.timefactor), up to time_factor_max")
    time_factor_max: Annotated[float, Field(ge=1, le=1e6, allow_inf_nan=False)] = Field(
        default=20.0, description="the largest factor time_factor: auto may choose (a run "
        "that needs more says so, runs at this one and names the way out)")
    time_factor_min: Annotated[float, Field(ge=1, le=1e6, allow_inf_nan=False)] = Field(
        default=1.0, description="the smallest factor time_factor: auto may choose (the "
        "network is calibrated at it first)")
    time_factor_reruns: Annotated[int, Field(ge=0, le=3)] = Field(
        default=1, description="time_factor: auto: when a finished run's fidelity verdict "
        "fails on an invariant that time dilation shrinks (RTT error, the workers' or the "
        "forwarders' timer slack), run it again, at most this many times, at the factor "
        "its own measurements ask for (up to time_factor_max; testbed.emu.timefactor."
        "rerun_factor); 0: never")
    link_mode: Literal["auto", "netem", "userspace"] = "auto"
    datapath: Literal["auto", "user", "kernel"] = "auto"
    hosts_per_dc: Annotated[int, Field(ge=1, le=64)] = 2
    dc_fabric: Literal["single", "leaf_spine"] = "single"
    leaf_spine: LeafSpineSpec = Field(default_factory=LeafSpineSpec)
    max_rate_mbps: Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)] = Field(
        default=1000.0, description="refuse to emulate a link faster than this (one machine)"
    )
    lightpath_gbps: PositiveFloat = Field(
        default=100.0, description="real bitrate of the static DC-pair lightpaths the emulator "
        "sets up before an SDN controller manages them (slots = ceil(rate / per-slot rate))"
    )
    fibre_loss: Annotated[float, Field(ge=0, le=0.5, allow_inf_nan=False)] = Field(
        default=0.0, description="random loss probability on every emulated fibre (0..0.5)"
    )
    workers: Literal["shadow", "model"] = Field(
        default="shadow", description="pp_jobs: PyTorch worker mode (shadow: the job's stage "
        "times and activation sizes, scaled; model: a tiny GPT trained on synthetic tokens)")
    worker_compute: Literal["cpu", "device"] = Field(
        default="cpu", description="pp_jobs shadow workers: where a stage's compute time is "
        "spent (cpu: real float32 tensor work on this machine's CPU, duty-cycled, which "
        "competes with the link emulators and switches for the cores; device: on a "
        "stand-in accelerator, the op's time passing on a timer with the host CPU left "
        "free, as a GPU kernel leaves its host; docs/workers.md)")
    worker_iterations: Annotated[int, Field(ge=1, le=10_000)] = Field(
        default=3, description="pp_jobs: measured iterations each emulated job runs")
    worker_warmup_iterations: Annotated[int, Field(ge=0, le=100)] = Field(
        default=1, description="pp_jobs: iterations run first and left out of the timing")
    iterate_through_events: bool = Field(
        default=False, description="pp_jobs with events: after worker_iterations, the jobs "
        "go on iterating until every event has run (and 2 s more), however long an "
        "iteration takes on this machine; stages on other machines run worker_iterations "
        "only")
    max_jobs: Annotated[int, Field(ge=1, le=64)] = Field(
        default=2, description="pp_jobs: emulate the first N placed jobs concurrently")
    forwarding: Literal["controller", "static"] = Field(
        default="controller", description="who programs the switches: the os-ken SDN "
        "controller (lightpaths set up through its REST API; needs os-ken) or static "
        "OpenFlow rules written once by the emulator")
    max_requests: Annotated[int, Field(ge=1, le=10_000)] = Field(
        default=50, description="lightpath_requests: replay the first N requests of the "
        "scenario through the controller")
    startup_timeout_s: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] | None = Field(
        default=None, description="how long each part (Open vSwitch, link emulators, "
        "controller, workers, Prometheus) may take to come up; default: 30 s scaled by how "
        "much slower than a reference machine this one runs Python (under software "
        "emulation, several times)")
    replay_s: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] = Field(
        default=15.0, description="lightpath_requests/events: wall-clock seconds the replayed "
        "sample (and the spec events in it) is scaled to")
    delay_calibration: bool = Field(
        default=True, description="after the network is up, ping every DC pair, take each "
        "path's own processing time (switches, link emulators) off its fibres' emulated "
        "delays, so that every DC pair's RTT is 2 x its configured one-way delay (the "
        "verification records each pair against +- 1 ms; false: configured delays as "
        "they are)")
    rtt_check: Literal["auto", "enforce", "warn"] = Field(
        default="auto", description="a DC pair whose RTT median stays outside 2 x its "
        "configured one-way delay +- 1 ms after calibrating again: enforce fails the run, "
        "warn records it and goes on; auto enforces with netem links and the kernel "
        "datapath (a VM, docs/vm.md) and warns with the user-space link emulator and "
        "datapath, whose processing time drifts by up to 1 ms on a busy small machine")

    @model_validator(mode="after")
    def _factor_bounds(self) -> EmulationSpec:
        if self.time_factor_min > self.time_factor_max:
            raise ValueError(f"time_factor_min {self.time_factor_min:g} is above "
                             f"time_factor_max {self.time_factor_max:g}")
        return self

    @model_validator(mode="after")
    def _device_for_shadow(self) -> EmulationSpec:
        if self.worker_compute == "device" and self.workers == "model":
            raise ValueError("worker_compute: device is for workers: shadow (model mode "
                             "computes its tiny GPT on the CPU)")
        return self


class Scenario(Frozen):
    """A whole scenario: topology, DCs, optical layer, workload, policies, events."""

    version: Literal[1] = 1
    name: str
    description: str = ""
    topology: TopologySpec
    dcs: list[DCSpec] = Field(default_factory=list)
    optical: OpticalSpec = Field(default_factory=OpticalSpec)
    workload: Workload
    policy: PolicySpec = Field(default_factory=PolicySpec)
    events: Annotated[list[EventSpec], Field(max_length=MAX_EVENTS)] = Field(
        default_factory=list)
    emulation: EmulationSpec = Field(default_factory=EmulationSpec)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return names.check(names.SCENARIO_NAME_RE, value, "scenario name")
