"""What a soak records, one frozen type per kind of line in its JSONL time series.

`t` is Unix time in seconds everywhere, so GPU samples (written by the sampler child), Xid events and the server's
intervals (written by the parent) line up. A value NVML could not give is None; `lost` says the GPU stopped
answering (NVML_ERROR_GPU_IS_LOST 15, RESET_REQUIRED 16), the way GpuHealth.lost does for the doctor.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class GpuSample:
    """One GPU read once: clocks and every clock-event reason, power, temperatures, fan, ECC, PCIe."""

    t: float
    gpu: int
    name: str = ""
    sm_mhz: int | None = None
    mem_mhz: int | None = None
    base_sm_mhz: int | None = None  # nvmlDeviceGetClock(NVML_CLOCK_SM, NVML_CLOCK_ID_APP_CLOCK_DEFAULT)
    reasons: int | None = None  # nvmlClocksEventReasons bit mask (doctor/node_health/verdicts.REASONS)
    power_mw: int | None = None
    power_limit_mw: int | None = None
    temperature_c: int | None = None
    memory_temperature_c: int | None = None
    slowdown_c: int | None = None  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    fan_percent: int | None = None
    utilization: int | None = None  # GPU busy percent
    ecc_corrected: int | None = None  # volatile totals since the driver loaded
    ecc_uncorrected: int | None = None
    remap_pending: int | None = None
    remap_failure: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_replay: int | None = None
    lost: str = ""  # "" while NVML answers for this GPU

    kind = "gpu"


@dataclass(frozen=True)
class XidSample:
    """An Xid seen during the soak: from NVML's event API (`source` "nvml") or a kernel log line ("kernel log")."""

    t: float
    xid: int
    gpu: int | None = None
    pci: str = ""
    text: str = ""
    source: str = "nvml"

    kind = "xid"


@dataclass(frozen=True)
class ServerInterval:
    """The server over one interval [t, t + seconds): tokens that arrived, requests finished and failed, and how
    many requests were in flight at its end."""

    t: float
    seconds: float
    tokens: int
    done: int
    errors: int
    in_flight: int
    error: str = ""  # the first error text of the interval

    kind = "server"

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class SamplerNote:
    """What the sampler child said about itself: started, stopped, hung (killed by the watchdog), NVML absent."""

    t: float
    event: str  # "start", "end", "hung", "failed"
    text: str = ""

    kind = "sampler"


Sample = GpuSample | XidSample | ServerInterval | SamplerNote
KINDS: Mapping[str, type[GpuSample] | type[XidSample] | type[ServerInterval] | type[SamplerNote]] = {
    "gpu": GpuSample,
    "xid": XidSample,
    "server": ServerInterval,
    "sampler": SamplerNote,
}


class SampleError(ValueError):
    """A JSONL line that is not a soak sample; the message names the line."""


def to_line(sample: Sample) -> str:
    return json.dumps({"kind": sample.kind, **asdict(sample)}, sort_keys=True)


def from_json(data: object, where: str = "line") -> Sample:
    if not isinstance(data, dict):
        raise SampleError(f"{where}: not a JSON object")
    kind = KINDS.get(str(data.get("kind")))
    if kind is None:
        raise SampleError(f"{where}: unknown kind {data.get('kind')!r}")
    names = {f.name: f for f in fields(kind)}
    values = {k: v for k, v in data.items() if k in names}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, str, type(None))):
            raise SampleError(f"{where}: {key} is {type(value).__name__}")
    try:
        return kind(**values)
    except TypeError as exc:
        raise SampleError(f"{where}: {exc}") from None


def parse_lines(text: str) -> tuple[list[Sample], list[str]]:
    """Samples of a JSONL text in time order, and one note per line left out (a line cut by a kill, a header)."""
    found: list[Sample] = []
    skipped: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError:
            skipped.append(f"line {number}: not JSON (cut short?)")
            continue
        if isinstance(data, dict) and data.get("kind") == "meta":
            continue
        try:
            found.append(from_json(data, f"line {number}"))
        except SampleError as exc:
            skipped.append(str(exc))
    found.sort(key=lambda s: s.t)
    return found, skipped
