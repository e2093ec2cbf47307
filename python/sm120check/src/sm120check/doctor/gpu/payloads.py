"""The answer of gpu/node_health_probe.py: per-GPU NVML readings, the busy-link copy measurements, the kernel log's
Xids.

Every NVML reading keeps how the call went (`Reading.status`): "ok", "not supported", "not in this driver" (the
symbol is missing from libnvidia-ml), or "NVML error N (text)"; a verdict never has to guess why a value is absent.
"""

from __future__ import annotations

from dataclasses import dataclass

from sm120check.doctor.payload import Fields

PROBE = "node_health"

OK = "ok"
NOT_SUPPORTED = "not supported"
NOT_IN_DRIVER = "not in this driver"


@dataclass(frozen=True)
class Reading:
    """One NVML value; `value` is None unless `status` is "ok"."""

    value: int | None
    status: str = OK

    @property
    def ok(self) -> bool:
        return self.status == OK and self.value is not None

    def shown(self, unit: str = "") -> str:
        return f"{self.value}{unit}" if self.ok else f"({self.status})"

    def to_json(self) -> dict[str, object]:
        return {"value": self.value, "status": self.status}

    @classmethod
    def from_json(cls, f: Fields) -> Reading:
        return cls(f.maybe_integer("value"), f.text("status"))


def missing(status: str) -> Reading:
    return Reading(None, status)


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None  # None: NVML could not say (NVML_VALUE_NOT_AVAILABLE, or no permission)
    name: str = ""  # from /proc/<pid>/comm when readable

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "used_bytes": self.used_bytes, "name": self.name}

    @classmethod
    def from_json(cls, f: Fields) -> GpuProcess:
        return cls(f.integer("pid"), f.maybe_integer("used_bytes"), f.text("name"))


@dataclass(frozen=True)
class LinkSample:
    """The link and clock-event reasons read by the sampler thread while copies ran."""

    gen: int | None
    width: int | None
    reasons: int | None  # nvmlClocksEventReasons bit mask

    def to_json(self) -> dict[str, object]:
        return {"gen": self.gen, "width": self.width, "reasons": self.reasons}

    @classmethod
    def from_json(cls, f: Fields) -> LinkSample:
        return cls(f.maybe_integer("gen"), f.maybe_integer("width"), f.maybe_integer("reasons"))


@dataclass(frozen=True)
class LoadResult:
    """Pinned host<->device copies on one GPU (cuMemcpy through the CUDA driver API), median of `repeats`."""

    h2d_gbps: float | None
    d2h_gbps: float | None
    size_bytes: int
    repeats: int
    seconds: float
    samples: tuple[LinkSample, ...] = ()
    error: str = ""  # the CUDA call that failed, if any

    @property
    def busy_gen(self) -> int | None:
        gens = [s.gen for s in self.samples if s.gen is not None]
        return max(gens) if gens else None

    @property
    def busy_width(self) -> int | None:
        widths = [s.width for s in self.samples if s.width is not None]
        return max(widths) if widths else None

    @property
    def busy_reasons(self) -> int | None:
        masks = [s.reasons for s in self.samples if s.reasons is not None]
        if not masks:
            return None
        combined = 0
        for mask in masks:
            combined |= mask
        return combined

    def to_json(self) -> dict[str, object]:
        return {
            "h2d_gbps": self.h2d_gbps,
            "d2h_gbps": self.d2h_gbps,
            "size_bytes": self.size_bytes,
            "repeats": self.repeats,
            "seconds": self.seconds,
            "samples": [s.to_json() for s in self.samples],
            "error": self.error,
        }

    @classmethod
    def from_json(cls, f: Fields) -> LoadResult:
        return cls(
            f.maybe_number("h2d_gbps"),
            f.maybe_number("d2h_gbps"),
            f.integer("size_bytes"),
            f.integer("repeats"),
            f.number("seconds"),
            tuple(LinkSample.from_json(s) for s in f.objects("samples")),
            f.text("error"),
        )


@dataclass(frozen=True)
class ClockSample:
    """What the sampler reads while the compute kernel keeps every SM busy."""

    reasons: int | None  # nvmlClocksEventReasons bit mask
    sm_mhz: int | None
    power_mw: int | None
    temperature_c: int | None

    def to_json(self) -> dict[str, object]:
        return {
            "reasons": self.reasons,
            "sm_mhz": self.sm_mhz,
            "power_mw": self.power_mw,
            "temperature_c": self.temperature_c,
        }

    @classmethod
    def from_json(cls, f: Fields) -> ClockSample:
        return cls(
            f.maybe_integer("reasons"),
            f.maybe_integer("sm_mhz"),
            f.maybe_integer("power_mw"),
            f.maybe_integer("temperature_c"),
        )


@dataclass(frozen=True)
class ComputeLoad:
    """A bounded FMA spin kernel (NVRTC PTX, cuLaunchKernel) on every SM, with clocks sampled while it ran.
    `error` set: it did not run (NVRTC absent, a CUDA call failed) and `samples` may be empty."""

    seconds: float  # the timed launch, on the GPU's clock (events)
    iterations: int  # per thread, calibrated by a first short launch
    blocks: int
    threads: int
    arch: str  # the NVRTC target, "compute_90"
    samples: tuple[ClockSample, ...] = ()
    error: str = ""

    @property
    def reasons(self) -> int | None:
        """Every reason bit seen during the kernel (None: no sample read them)."""
        masks = [s.reasons for s in self.samples if s.reasons is not None]
        combined = 0
        for mask in masks:
            combined |= mask
        return combined if masks else None

    @property
    def sm_mhz_min(self) -> int | None:
        values = [s.sm_mhz for s in self.samples if s.sm_mhz is not None]
        return min(values) if values else None

    @property
    def power_mw_max(self) -> int | None:
        values = [s.power_mw for s in self.samples if s.power_mw is not None]
        return max(values) if values else None

    @property
    def temperature_c_max(self) -> int | None:
        values = [s.temperature_c for s in self.samples if s.temperature_c is not None]
        return max(values) if values else None

    def to_json(self) -> dict[str, object]:
        return {
            "seconds": self.seconds,
            "iterations": self.iterations,
            "blocks": self.blocks,
            "threads": self.threads,
            "arch": self.arch,
            "samples": [s.to_json() for s in self.samples],
            "error": self.error,
        }

    @classmethod
    def from_json(cls, f: Fields) -> ComputeLoad:
        return cls(
            f.number("seconds"),
            f.integer("iterations"),
            f.integer("blocks"),
            f.integer("threads"),
            f.text("arch"),
            tuple(ClockSample.from_json(s) for s in f.objects("samples")),
            f.text("error"),
        )


READING_FIELDS = (  # the GpuHealth fields that are Readings, in order
    "memory_total",
    "memory_used",
    "pcie_gen",
    "pcie_width",
    "pcie_gen_max",
    "pcie_gen_gpu_max",
    "pcie_width_max",
    "pcie_replay",
    "ecc_mode",
    "ecc_mode_pending",
    "ecc_uncorrected_volatile",
    "ecc_uncorrected_aggregate",
    "retired_pages",
    "retired_pending",
    "remap_correctable",
    "remap_uncorrectable",
    "remap_pending",
    "remap_failure",
    "clock_reasons",
    "power_limit_mw",
    "power_default_mw",
    "power_enforced_mw",
    "temperature_c",
    "mig_mode",
    "mig_mode_pending",
    "bar1_total",
    "bar1_used",
)


@dataclass(frozen=True)
class GpuHealth:
    """What NVML said about one GPU at rest (before the load), plus the load's measurements."""

    index: int
    name: str
    bus_id: str  # NVML's form, "00000000:3B:00.0"
    memory_total: Reading  # bytes
    memory_used: Reading
    pcie_gen: Reading  # current link generation (idle: may have dropped to Gen1 to save power)
    pcie_width: Reading  # current lanes
    pcie_gen_max: Reading  # the most this GPU in this slot can train to (nvmlDeviceGetMaxPcieLinkGeneration)
    pcie_gen_gpu_max: Reading  # the GPU's own maximum (nvmlDeviceGetGpuMaxPcieLinkGeneration)
    pcie_width_max: Reading
    pcie_replay: Reading  # PCIe replay counter since the driver loaded
    ecc_mode: Reading  # 1 on, 0 off
    ecc_mode_pending: Reading
    ecc_uncorrected_volatile: Reading  # since the driver loaded
    ecc_uncorrected_aggregate: Reading  # lifetime
    retired_pages: Reading  # single-bit (multiple) + double-bit causes
    retired_pending: Reading  # 1: a retirement waits for a reboot / reset
    remap_correctable: Reading
    remap_uncorrectable: Reading
    remap_pending: Reading
    remap_failure: Reading
    clock_reasons: Reading  # at rest
    power_limit_mw: Reading
    power_default_mw: Reading
    power_enforced_mw: Reading
    temperature_c: Reading
    mig_mode: Reading  # 1 enabled
    mig_mode_pending: Reading
    bar1_total: Reading  # bytes
    bar1_used: Reading
    processes: tuple[GpuProcess, ...] = ()
    processes_status: str = OK
    load: LoadResult | None = None  # None: --no-load, or the load did not run (NodeHealth.load_error)
    compute: ComputeLoad | None = None  # None: --no-load, or a payload from before the compute load existed

    @classmethod
    def unreadable(cls, index: int, status: str) -> GpuHealth:
        """A GPU NVML lists but cannot open (a GPU that fell off the bus: "NVML error 15 (GPU is lost)")."""
        readings = {key: missing(status) for key in READING_FIELDS}
        return cls(
            index=index, name="", bus_id="", processes=(), processes_status=status, load=None, compute=None, **readings
        )

    @property
    def lost(self) -> str:
        """The NVML status saying this GPU is gone (GPU_IS_LOST 15, RESET_REQUIRED 16), or ""."""
        for key in READING_FIELDS:
            status: str = getattr(self, key).status
            if status.startswith(("NVML error 15 ", "NVML error 16 ")):
                return status
        return ""

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {"index": self.index, "name": self.name, "bus_id": self.bus_id}
        for key in READING_FIELDS:
            reading: Reading = getattr(self, key)
            data[key] = reading.to_json()
        data["processes"] = [p.to_json() for p in self.processes]
        data["processes_status"] = self.processes_status
        data["load"] = None if self.load is None else self.load.to_json()
        data["compute"] = None if self.compute is None else self.compute.to_json()
        return data

    @classmethod
    def from_json(cls, f: Fields) -> GpuHealth:
        readings = {key: Reading.from_json(f.object(key)) for key in READING_FIELDS}
        load = None if f.data.get("load") is None else LoadResult.from_json(f.object("load"))
        compute = None if f.data.get("compute") is None else ComputeLoad.from_json(f.object("compute"))
        return cls(
            index=f.integer("index"),
            name=f.text("name"),
            bus_id=f.text("bus_id"),
            processes=tuple(GpuProcess.from_json(p) for p in f.objects("processes")),
            processes_status=f.text("processes_status"),
            load=load,
            compute=compute,
            **readings,
        )


@dataclass(frozen=True)
class XidEvent:
    """One `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., <text>` line (or a "fallen off the bus" line: xid 79)."""

    xid: int
    pci: str  # as the driver wrote it, "0000:3b:00"
    text: str  # the rest of the line
    uptime_s: float | None = None  # seconds since boot, when the log source gives it
    pid: int | None = None
    process: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "xid": self.xid,
            "pci": self.pci,
            "text": self.text,
            "uptime_s": self.uptime_s,
            "pid": self.pid,
            "process": self.process,
        }

    @classmethod
    def from_json(cls, f: Fields) -> XidEvent:
        return cls(
            f.integer("xid"),
            f.text("pci"),
            f.text("text"),
            f.maybe_number("uptime_s"),
            f.maybe_integer("pid"),
            f.text("process"),
        )


@dataclass(frozen=True)
class KernelLog:
    source: str  # "/dev/kmsg", "journalctl -k -b", "dmesg", or "" when none could be read
    events: tuple[XidEvent, ...] = ()
    error: str = ""  # why no source could be read ("kernel log unreadable: ... run as root")
    lines: int = 0  # lines read
    cut: str = ""  # what was left out of a log larger than the bound (its oldest lines), "" when nothing

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "events": [e.to_json() for e in self.events],
            "error": self.error,
            "lines": self.lines,
            "cut": self.cut,
        }

    @classmethod
    def from_json(cls, f: Fields) -> KernelLog:
        return cls(
            f.text("source"),
            tuple(XidEvent.from_json(e) for e in f.objects("events")),
            f.text("error"),
            f.integer("lines"),
            f.maybe_text("cut") or "",
        )


@dataclass(frozen=True)
class NodeHealth:
    """The whole answer. `nvml_error` set: NVML did not load (no GPU readings); the kernel log is read anyway."""

    gpus: tuple[GpuHealth, ...]
    kernel_log: KernelLog
    driver: str = ""
    nvml_error: str = ""
    load_error: str = ""  # the load as a whole did not run (libcuda missing, cuInit failed), or "" / "skipped"

    def to_json(self) -> dict[str, object]:
        return {
            "gpus": [g.to_json() for g in self.gpus],
            "kernel_log": self.kernel_log.to_json(),
            "driver": self.driver,
            "nvml_error": self.nvml_error,
            "load_error": self.load_error,
        }

    @classmethod
    def from_json(cls, data: object) -> NodeHealth:
        f = Fields(PROBE, data)
        return cls(
            tuple(GpuHealth.from_json(g) for g in f.objects("gpus")),
            KernelLog.from_json(f.object("kernel_log")),
            f.text("driver"),
            f.text("nvml_error"),
            f.text("load_error"),
        )


# ---- peer copies between GPUs (comm/peer_bandwidth_probe.py, the level-3 check gpu_peer_bandwidth) ------------------

PEER_PROBE = "peer_bandwidth"
PEER_NOT_MEASURED = "not measured"  # how a pair's error starts when the probe's time ran out before it


@dataclass(frozen=True)
class PeerLink:
    """One selected GPU's maximum PCIe link as NVML reads it (None: NVML could not; `status` says why)."""

    index: int  # NVML index
    bus_id: str  # NVML's form, "00000000:3B:00.0"
    gen_max: int | None
    width_max: int | None
    status: str = OK

    def to_json(self) -> dict[str, object]:
        return {
            "index": self.index,
            "bus_id": self.bus_id,
            "gen_max": self.gen_max,
            "width_max": self.width_max,
            "status": self.status,
        }

    @classmethod
    def from_json(cls, f: Fields) -> PeerLink:
        return cls(
            f.integer("index"),
            f.text("bus_id"),
            f.maybe_integer("gen_max"),
            f.maybe_integer("width_max"),
            f.text("status"),
        )


@dataclass(frozen=True)
class PeerPair:
    """Copies from GPU `src` to GPU `dst` (NVML indices) with cuMemcpyPeerAsync: the median GB/s of `repeats` copies
    of `size_bytes` on a stream of `src`'s context (`gbps`: src's copy engine pushes, PCIe posted writes), the same
    copies on a stream of `dst`'s context (`read_gbps`: dst's copy engine pulls, non-posted reads), the median time
    of small copies. `p2p` False: no peer access, the driver staged the copies through host memory. `error` set: a
    CUDA call failed (the figures it did not reach are None)."""

    src: int
    dst: int
    src_bus: str
    dst_bus: str
    p2p: bool
    gbps: float | None
    latency_us: float | None
    access: str = ""  # how peer access went: "enabled", "already enabled", "cuDeviceCanAccessPeer says no", ...
    nvlink: bool | None = None  # NVML: the pair talks over NVLink (None: NVML could not say)
    repeats: int = 0
    size_bytes: int = 0
    error: str = ""
    read_gbps: float | None = None  # None: not measured (a payload from before reads were timed, or an error first)
    read_repeats: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "src": self.src,
            "dst": self.dst,
            "src_bus": self.src_bus,
            "dst_bus": self.dst_bus,
            "p2p": self.p2p,
            "gbps": self.gbps,
            "latency_us": self.latency_us,
            "access": self.access,
            "nvlink": self.nvlink,
            "repeats": self.repeats,
            "size_bytes": self.size_bytes,
            "error": self.error,
            "read_gbps": self.read_gbps,
            "read_repeats": self.read_repeats,
        }

    @classmethod
    def from_json(cls, f: Fields) -> PeerPair:
        return cls(
            f.integer("src"),
            f.integer("dst"),
            f.text("src_bus"),
            f.text("dst_bus"),
            f.flag("p2p"),
            f.maybe_number("gbps"),
            f.maybe_number("latency_us"),
            f.text("access"),
            f.maybe_flag("nvlink"),
            f.integer("repeats"),
            f.integer("size_bytes"),
            f.text("error"),
            f.maybe_number("read_gbps"),
            f.maybe_integer("read_repeats") or 0,
        )


@dataclass(frozen=True)
class PeerAnswer:
    """The peer probe's whole answer: every ordered pair of the selected GPUs and each GPU's link. `error` set: the
    probe could not measure at all (NVML or libcuda did not load, cuInit failed, a GPU hidden from CUDA)."""

    pairs: tuple[PeerPair, ...]
    links: tuple[PeerLink, ...]
    latency_bytes: int = 4
    error: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "pairs": [p.to_json() for p in self.pairs],
            "links": [link.to_json() for link in self.links],
            "latency_bytes": self.latency_bytes,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, data: object) -> PeerAnswer:
        f = Fields(PEER_PROBE, data)
        return cls(
            tuple(PeerPair.from_json(p) for p in f.objects("pairs")),
            tuple(PeerLink.from_json(link) for link in f.objects("links")),
            f.integer("latency_bytes"),
            f.text("error"),
        )
