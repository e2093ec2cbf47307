"""Fleet outliers: a node's measured figures against the fleet's median for the same GPU model.

Each node's doctor report carries measured numbers in its checks' `data` (the PCIe link under load, pinned copy
bandwidth, NCCL and symmetric-memory allreduce latency, NCCL bus bandwidth). `extract` reads them from one node's
results into typed Figures; a missing or ill-typed key, NaN, infinity or a negative number makes that figure absent
and noted (Ignored), never a made-up value. `judge` groups every node's figures by (GPU model, GPUs in the
measurement, metric), takes each group's median and flags a figure whose deviation from it in the bad direction is
beyond the metric's threshold, the way SuperBench's data diagnosis applies its `variance` rule,
(value - baseline) / baseline, to each node (here the baseline is the fleet's own median). A group of fewer than
MIN_GROUP values is not judged ("too few to compare").

This module reads only the doctor's report types: the fleet model holds what it returns.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from sm120check.doctor.document import ReportResult

Better = Literal["higher", "lower"]

MIN_GROUP = 3  # values a group needs before its median is a baseline
MAX_GPUS = 64  # rows read per check: past it the rest are ignored (a node file is hostile until read)
MAX_SIZES = 32  # latency sizes (and symmetric-memory ops) read per check
MAX_RANKS = 1024
_NAME_MAX = 120
_TOKENS = re.compile(r"[0-9]{1,6}")
_OP = re.compile(r"[a-z][a-z0-9_]{0,31}")

# Families of metrics and their default thresholds: how far beyond the median, in the bad direction, as a fraction
# of the median. A link generation or width is flagged as soon as it is below the median (threshold 0).
FAMILIES: Mapping[str, float] = {"bandwidth": 0.15, "latency": 0.25, "link": 0.0}
# The fixed metric names (the others: nccl_allreduce.latency_us.<tokens>, symm_mem.latency_us.<op>.<tokens>, and per
# ordered GPU pair gpu_peer_bandwidth.gbps.<src>-<dst> / .latency_us.<src>-<dst>: a pair is compared with the same
# pair of the other nodes, since pairs on one switch and pairs across sockets differ on every node alike).
LINK_GEN, LINK_WIDTH = "pcie_link.gen", "pcie_link.width"
H2D, D2H = "gpu_copy_bandwidth.h2d_gbps", "gpu_copy_bandwidth.d2h_gbps"
BUSBW = "nccl_allreduce.busbw_gbps"
_METRIC = re.compile(
    r"pcie_link\.(gen|width)|gpu_copy_bandwidth\.(h2d|d2h)_gbps|nccl_allreduce\.busbw_gbps"
    r"|gpu_peer_bandwidth\.(gbps|latency_us)\.[0-9]{1,4}-[0-9]{1,4}"
    r"|nccl_allreduce\.latency_us\.[0-9]{1,6}|symm_mem\.latency_us\.[a-z][a-z0-9_]{0,31}\.[0-9]{1,6}"
)


class ThresholdError(ValueError):
    """A --outlier-threshold that cannot be used: the message names it and says how to write it."""


@dataclass(frozen=True)
class Figure:
    """One measured number of one node (of one GPU, or of the node's GPUs together when `gpu` is None)."""

    node: str
    gpu: int | None
    metric: str  # "<check id>.<data key path>": where it is in the doctor's JSON report
    value: float
    unit: str  # "GB/s", "us", "" (link generation, lanes)
    better: Better
    model: str  # GPU product name as the driver reports it ("A + B" for a node-level figure over mixed GPUs)
    ranks: int | None = None  # GPUs in a node-level measurement (the allreduce's world size)

    @property
    def group(self) -> str:
        """What the figure is compared within: the GPU model, or the model and ' x2' for a 2-GPU allreduce."""
        return self.model if self.ranks is None else f"{self.model} x{self.ranks}"


@dataclass(frozen=True)
class Ignored:
    """A figure a node's report gave that is not usable, and why."""

    node: str
    where: str  # "gpu_copy_bandwidth.gpus[1].h2d_gbps"
    why: str


@dataclass(frozen=True)
class NodeFigures:
    figures: tuple[Figure, ...] = ()
    ignored: tuple[Ignored, ...] = ()


@dataclass(frozen=True)
class Thresholds:
    """Fractions by family (bandwidth, latency, link) or by metric name; a metric's own wins over its family's."""

    given: tuple[tuple[str, float], ...] = ()

    def of(self, metric: str) -> float:
        chosen = dict(self.given)
        if metric in chosen:
            return chosen[metric]
        family = family_of(metric)
        return chosen.get(family, FAMILIES[family])

    def table(self) -> dict[str, float]:
        """Every family's threshold and each metric given on its own."""
        return {**FAMILIES, **dict(self.given)}


DEFAULT = Thresholds()


@dataclass(frozen=True)
class Group:
    """The figures of one (GPU model, ranks, metric) across the fleet."""

    group: str
    metric: str
    unit: str
    better: Better
    size: int
    median: float | None  # None when too few to compare

    @property
    def judged(self) -> bool:
        return self.median is not None


@dataclass(frozen=True)
class Outlier:
    figure: Figure
    median: float
    deviation: float  # (value - median) / median: negative is below the median
    threshold: float
    size: int  # values in the group, this one included


@dataclass(frozen=True)
class Review:
    """The fleet's figures judged: outliers (by node, GPU, metric), the groups, the figures that were ignored."""

    thresholds: Thresholds = DEFAULT
    outliers: tuple[Outlier, ...] = ()
    groups: tuple[Group, ...] = ()
    ignored: tuple[Ignored, ...] = ()

    @property
    def too_few(self) -> tuple[Group, ...]:
        return tuple(g for g in self.groups if not g.judged)

    def of_node(self, host: str) -> tuple[Outlier, ...]:
        return tuple(o for o in self.outliers if o.figure.node == host)

    def hosts(self) -> tuple[str, ...]:
        """The nodes with at least one outlier, sorted."""
        return tuple(sorted({o.figure.node for o in self.outliers}))


NOTHING = Review()  # a fleet with no figures


def family_of(metric: str) -> str:
    if metric.startswith("pcie_link."):
        return "link"
    return "latency" if ".latency_us." in metric else "bandwidth"


MAX_PAIRS = 256  # ordered GPU pairs read from gpu_peer_bandwidth (16 GPUs)


def parse_threshold(text: str) -> tuple[str, float]:
    """'bandwidth=0.2' or 'nccl_allreduce.latency_us.8=0.5' -> (name, fraction); ThresholdError says what is wrong."""
    name, equals, number = text.partition("=")
    name, number = name.strip(), number.strip()
    example = "e.g. --outlier-threshold bandwidth=0.2 (flag 20 % below the median)"
    if not equals or not name or not number:
        raise ThresholdError(f"--outlier-threshold {text!r} is not METRIC=FRACTION; {example}")
    if name not in FAMILIES and not _METRIC.fullmatch(name):
        raise ThresholdError(
            f"--outlier-threshold {text!r}: {name!r} is no metric; give a family ({', '.join(FAMILIES)}) or a "
            "metric name as the report shows it (pcie_link.width, gpu_copy_bandwidth.h2d_gbps, "
            "nccl_allreduce.busbw_gbps, nccl_allreduce.latency_us.8, symm_mem.latency_us.one_shot.8)"
        )
    try:
        fraction = float(number)
    except ValueError:
        raise ThresholdError(f"--outlier-threshold {text!r}: {number!r} is not a number; {example}") from None
    family = name if name in FAMILIES else family_of(name)
    ceiling = 10.0 if family == "latency" else 1.0
    if not math.isfinite(fraction) or fraction < 0 or fraction >= ceiling:
        hint = f"write {fraction / 100:g} for {fraction:g} %" if 1 <= fraction < 100 else f"{example}"
        raise ThresholdError(
            f"--outlier-threshold {text!r}: {number} is not a fraction from 0 to below {ceiling:g} for {family}; {hint}"
        )
    return name, fraction


def thresholds(texts: Iterable[str]) -> Thresholds:
    """Thresholds from --outlier-threshold values (a later one for the same name wins)."""
    chosen: dict[str, float] = {}
    for text in texts:
        name, fraction = parse_threshold(text)
        chosen[name] = fraction
    return Thresholds(tuple(sorted(chosen.items())))


# --- extraction: one node's results -> figures ---------------------------------------------------------------------


class _Reader:
    """Reads one node's figures, noting everything it cannot use."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.figures: list[Figure] = []
        self.ignored: list[Ignored] = []

    def skip(self, where: str, why: str) -> None:
        self.ignored.append(Ignored(self.host, where, why))

    def number(self, value: object, where: str, positive: bool) -> float | None:
        """A finite non-negative (or positive) JSON number; None (absent) stays silent, anything else is noted."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.skip(where, f"{_show(value)} is not a number")
            return None
        number = float(value)
        if not math.isfinite(number):
            self.skip(where, f"{_show(value)} is not a finite number")
            return None
        if number < 0 or (positive and number == 0):
            self.skip(where, f"{_show(value)} is not a {'positive' if positive else 'non-negative'} number")
            return None
        return number

    def rows(self, data: Mapping[str, object], check: str) -> list[tuple[int, Mapping[str, object], str]]:
        """(GPU index, row, where) for each usable row of data["gpus"]: one per index, at most MAX_GPUS."""
        gpus = data.get("gpus")
        if gpus is None:
            return []
        if not isinstance(gpus, list):
            self.skip(f"{check}.gpus", f"{_show(gpus)} is not a list")
            return []
        if len(gpus) > MAX_GPUS:
            self.skip(f"{check}.gpus", f"{len(gpus)} rows; only the first {MAX_GPUS} are read")
        rows: list[tuple[int, Mapping[str, object], str]] = []
        seen: set[int] = set()
        for position, row in enumerate(gpus[:MAX_GPUS]):
            where = f"{check}.gpus[{position}]"
            if not isinstance(row, dict):
                self.skip(where, f"{_show(row)} is not an object")
                continue
            index = row.get("index")
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_RANKS:
                self.skip(f"{where}.index", f"{_show(index)} is not a GPU index")
                continue
            if index in seen:
                self.skip(where, f"GPU {index} is listed twice; the first row is used")
                continue
            seen.add(index)
            rows.append((index, row, where))
        return rows

    def add(
        self,
        gpu: int | None,
        metric: str,
        value: float,
        unit: str,
        better: Better,
        model: str,
        ranks: int | None = None,
    ) -> None:
        self.figures.append(Figure(self.host, gpu, metric, value, unit, better, model, ranks))


def extract(host: str, results: Sequence[ReportResult]) -> NodeFigures:
    """The measured figures of one node's doctor results, and what was given but not usable. Only checks that passed
    or warned count: a failed check's numbers (a wrong or hung allreduce) are no measurement to compare."""
    reader = _Reader(host)
    by_id = {r.id: r for r in results}
    models = _models(reader, by_id.get("driver"))
    for check in ("pcie_link", "gpu_copy_bandwidth", "gpu_peer_bandwidth", "nccl_allreduce", "symm_mem"):
        result = by_id.get(check)
        if result is None or result.status.value == "skip":
            continue
        if result.status.value == "fail":
            if result.data:
                reader.skip(check, "the check failed: its figures are not compared")
            continue
        if check == "pcie_link":
            _link(reader, result.data, models)
        elif check == "gpu_copy_bandwidth":
            _copy(reader, result.data, models)
        elif check == "gpu_peer_bandwidth":
            _peer(reader, result.data, models)
        elif check == "nccl_allreduce":
            _nccl(reader, result.data, models)
        else:
            _symm(reader, result.data, models)
    return NodeFigures(tuple(reader.figures), tuple(reader.ignored))


def _models(reader: _Reader, driver: ReportResult | None) -> dict[int, str]:
    """GPU index -> product name from the driver check's data["gpus"] (NVML's names: exact, editions differ)."""
    if driver is None:
        return {}
    models: dict[int, str] = {}
    for index, row, where in reader.rows(driver.data, "driver"):
        name = row.get("name")
        if isinstance(name, str) and name.strip():
            models[index] = _name(name)
        else:
            reader.skip(f"{where}.name", f"{_show(name)} is not a GPU name")
    return models


def _gpu_model(reader: _Reader, index: int, row: Mapping[str, object], where: str, models: dict[int, str]) -> str:
    """The driver's name for GPU `index`, else the row's own `name`; "" (and noted) when neither gives one."""
    if index in models:
        return models[index]
    name = row.get("name")
    if isinstance(name, str) and name.strip():
        return _name(name)
    reader.skip(where, f"GPU {index} has no model name (the driver check lists no such GPU): not compared")
    return ""


def _node_model(reader: _Reader, check: str, models: dict[int, str]) -> str:
    names = sorted(set(models.values()))
    if not names:
        reader.skip(check, "the driver check gives no GPU names, so the node's GPU model is unknown: not compared")
    return " + ".join(names)


def _link(reader: _Reader, data: Mapping[str, object], models: dict[int, str]) -> None:
    for index, row, where in reader.rows(data, "pcie_link"):
        model = _gpu_model(reader, index, row, where, models)
        if not model:
            continue
        if row.get("busy") is not True:  # links drop generation (and some width) at idle: only a loaded read counts
            if row.get("gen") is not None or row.get("width") is not None:
                reader.skip(f"{where}.busy", "the link was read idle, not under load: not compared")
            continue
        for key, metric in (("gen", LINK_GEN), ("width", LINK_WIDTH)):
            value = row.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                reader.skip(f"{where}.{key}", f"{_show(value)} is not an integer")
                continue
            number = reader.number(value, f"{where}.{key}", positive=True)
            if number is not None:
                reader.add(index, metric, number, "", "higher", model)


def _copy(reader: _Reader, data: Mapping[str, object], models: dict[int, str]) -> None:
    for index, row, where in reader.rows(data, "gpu_copy_bandwidth"):
        model = _gpu_model(reader, index, row, where, models)
        if not model:
            continue
        for key, metric in (("h2d_gbps", H2D), ("d2h_gbps", D2H)):
            number = reader.number(row.get(key), f"{where}.{key}", positive=False)
            if number is not None:
                reader.add(index, metric, number, "GB/s", "higher", model)


def _peer(reader: _Reader, data: Mapping[str, object], models: dict[int, str]) -> None:
    """Per ordered pair: GB/s (higher is better) and latency (lower), attributed to the source GPU's model."""
    pairs = data.get("pairs")
    if pairs is None:
        return
    if not isinstance(pairs, list):
        reader.skip("gpu_peer_bandwidth.pairs", f"{_show(pairs)} is not a list")
        return
    if len(pairs) > MAX_PAIRS:
        reader.skip("gpu_peer_bandwidth.pairs", f"{len(pairs)} pairs; only the first {MAX_PAIRS} are read")
    seen: set[tuple[int, int]] = set()
    for position, row in enumerate(pairs[:MAX_PAIRS]):
        where = f"gpu_peer_bandwidth.pairs[{position}]"
        if not isinstance(row, dict):
            reader.skip(where, f"{_show(row)} is not an object")
            continue
        src, dst = row.get("src"), row.get("dst")
        if not (_index(src) and _index(dst)) or not isinstance(src, int) or not isinstance(dst, int):
            reader.skip(where, f"src {_show(src)}, dst {_show(dst)} are not GPU indices")
            continue
        if src == dst or (src, dst) in seen:
            reader.skip(where, f"pair {src}-{dst} is no pair of two GPUs or is listed twice: not compared")
            continue
        seen.add((src, dst))
        model = _gpu_model(reader, src, {}, where, models)
        if not model:
            continue
        for key, unit, better in PEER_MEASURES:
            number = reader.number(row.get(key), f"{where}.{key}", positive=True)
            if number is not None:
                reader.add(src, f"gpu_peer_bandwidth.{key}.{src}-{dst}", number, unit, better, model)


PEER_MEASURES: tuple[tuple[str, str, Better], ...] = (("gbps", "GB/s", "higher"), ("latency_us", "us", "lower"))


def _index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_RANKS


def _ranks(reader: _Reader, value: object, where: str) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RANKS:
        reader.skip(where, f"{_show(value)} is not a GPU count: the node's allreduce figures are not compared")
        return None
    return value


def _latencies(reader: _Reader, value: object, where: str) -> list[tuple[str, float]]:
    """(tokens, microseconds) from {"<tokens>": us}; keys must be token counts, at most MAX_SIZES of them."""
    if value is None:
        return []
    if not isinstance(value, dict):
        reader.skip(where, f"{_show(value)} is not an object of latencies by token count")
        return []
    if len(value) > MAX_SIZES:
        reader.skip(where, f"{len(value)} sizes; only the first {MAX_SIZES} are read")
    found: dict[str, float] = {}
    for tokens, us in itertools.islice(value.items(), MAX_SIZES):
        if not _TOKENS.fullmatch(tokens):
            reader.skip(f"{where}[{_show(tokens)}]", "the key is not a token count")
            continue
        if str(int(tokens)) in found:
            reader.skip(f"{where}.{tokens}", f"{int(tokens)} tokens given twice; the first is used")
            continue
        number = reader.number(us, f"{where}.{tokens}", positive=True)
        if number is not None:
            found[str(int(tokens))] = number
    return list(found.items())


def _nccl(reader: _Reader, data: Mapping[str, object], models: dict[int, str]) -> None:
    ranks = _ranks(reader, data.get("world_size"), "nccl_allreduce.world_size")
    model = _node_model(reader, "nccl_allreduce", models) if ranks is not None else ""
    if not model:
        return
    busbw = reader.number(data.get("busbw_gbps"), "nccl_allreduce.busbw_gbps", positive=False)
    if busbw is not None:
        reader.add(None, BUSBW, busbw, "GB/s", "higher", model, ranks)
    for tokens, us in _latencies(reader, data.get("latency_us"), "nccl_allreduce.latency_us"):
        reader.add(None, f"nccl_allreduce.latency_us.{tokens}", us, "us", "lower", model, ranks)


def _symm(reader: _Reader, data: Mapping[str, object], models: dict[int, str]) -> None:
    ptrs = data.get("multicast_ptr")  # one per rank: the measurement's world size
    ranks = _ranks(reader, len(ptrs) if isinstance(ptrs, list) else ptrs, "symm_mem.multicast_ptr")
    model = _node_model(reader, "symm_mem", models) if ranks is not None else ""
    if not model:
        return
    ops = data.get("latency_us")
    if ops is None:
        return
    if not isinstance(ops, dict):
        reader.skip("symm_mem.latency_us", f"{_show(ops)} is not an object of latencies by operation")
        return
    if len(ops) > MAX_SIZES:
        reader.skip("symm_mem.latency_us", f"{len(ops)} operations; only the first {MAX_SIZES} are read")
    for op, sizes in itertools.islice(ops.items(), MAX_SIZES):
        if not _OP.fullmatch(op):
            reader.skip(f"symm_mem.latency_us[{_show(op)}]", "the key is not an operation name")
            continue
        for tokens, us in _latencies(reader, sizes, f"symm_mem.latency_us.{op}"):
            reader.add(None, f"symm_mem.latency_us.{op}.{tokens}", us, "us", "lower", model, ranks)


def _name(text: str) -> str:
    name = " ".join(text.split())
    return name if len(name) <= _NAME_MAX else name[: _NAME_MAX - 3] + "..."


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- judging: every node's figures -> outliers ---------------------------------------------------------------------


def judge(figures: Sequence[Figure], ignored: Sequence[Ignored] = (), limits: Thresholds = DEFAULT) -> Review:
    """Median per (group, metric) over the fleet; a figure beyond its threshold in the bad direction is an outlier
    (groups of fewer than MIN_GROUP values are listed, not judged). Outliers sorted by node, GPU, metric."""
    grouped: dict[tuple[str, str], list[Figure]] = {}
    for figure in figures:
        grouped.setdefault((figure.group, figure.metric), []).append(figure)
    groups: list[Group] = []
    outliers: list[Outlier] = []
    for (group, metric), members in sorted(grouped.items()):
        first = members[0]
        if len(members) < MIN_GROUP:
            groups.append(Group(group, metric, first.unit, first.better, len(members), None))
            continue
        median = float(statistics.median(f.value for f in members))
        groups.append(Group(group, metric, first.unit, first.better, len(members), median))
        if median <= 0:
            continue  # nothing is below a zero bandwidth; latencies are positive
        limit = limits.of(metric)
        for figure in members:
            deviation = (figure.value - median) / median
            bad = deviation < -limit if figure.better == "higher" else deviation > limit
            if bad:
                outliers.append(Outlier(figure, median, deviation, limit, len(members)))
    outliers.sort(key=lambda o: (o.figure.node, -1 if o.figure.gpu is None else o.figure.gpu, o.figure.metric))
    return Review(limits, tuple(outliers), tuple(groups), tuple(ignored))


def describe(limits: Thresholds) -> str:
    """'bandwidth 15 % below, latency 25 % above, link below the median' (and each metric given on its own)."""
    parts = []
    for name, fraction in limits.table().items():
        family = name if name in FAMILIES else family_of(name)
        direction = "above" if family == "latency" else "below"
        parts.append(f"{name} {direction}" if fraction == 0 else f"{name} {fraction * 100:g} % {direction}")
    return ", ".join(parts) + " the median"
