"""Which `CUDA_VISIBLE_DEVICES` order keeps each tensor-parallel group behind one root complex.

A GPU's root complex is the host bridge its sysfs path starts from (`/sys/devices/pci0000:40/0000:40:01.1/...`:
`pci0000:40`, sysfs.py). Peer traffic between GPUs behind two root complexes crosses the CPU's fabric (`nvidia-smi
topo -m` says NODE or SYS), where posted writes can collapse (local-inference-lab/rtx6kpro, hardware/collapse-report.md)
and where PCIe P2P is least likely to work at all; a TP group whose GPUs share a root complex keeps its all-reduce
below it (PIX, PXB or PHB). SGLang's TP group of one server is the first `tp` visible devices (`--base-gpu-id`,
`--gpu-id-step` move it), so the order of CUDA_VISIBLE_DEVICES decides which GPUs share a group.

Assumptions, said in every suggestion: CUDA numbers the GPUs in PCI bus order (domain, bus, device, function), which
it does with `CUDA_DEVICE_ORDER=PCI_BUS_ID` (the default, FASTEST_FIRST, may differ; the sglang_server role sets it);
and every NVIDIA GPU sysfs lists is one CUDA device (none bound to vfio-pci, no MIG, no outer CUDA_VISIBLE_DEVICES).

Pure functions of the GPUs' places: `places(view)` numbers them, `plan(places)` suggests for tp 2, 4 and 8 as the GPU
count allows (or the given tp sizes).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sm120check.doctor.payload import Fields, PayloadError
from sm120check.doctor.pcie.sysfs import SysGpu

TP_SIZES = (2, 4, 8)
ASSUMES = "CUDA_DEVICE_ORDER=PCI_BUS_ID"
UNKNOWN_ROOT = "unknown root complex"
WHAT = "tp_groups"  # the payload's name in PayloadError messages


class Fit(str, enum.Enum):
    """How well a tp size fits the node's root complexes."""

    ONE_ROOT = "one_root"  # every GPU is behind one root complex: any order keeps each group behind it
    KEPT = "kept"  # the suggested order keeps every group behind one root complex
    CROSSES = "crosses"  # no order does: this many groups must span root complexes (named)
    TOO_FEW = "too_few"  # fewer GPUs than tp


@dataclass(frozen=True)
class GpuPlace:
    index: int  # the CUDA device index, with CUDA_DEVICE_ORDER=PCI_BUS_ID
    bdf: str
    root: str  # the root complex (host bridge), "pci0000:40"

    def to_json(self) -> dict[str, object]:
        return {"index": self.index, "bdf": self.bdf, "root": self.root}

    @classmethod
    def from_json(cls, f: Fields) -> GpuPlace:
        return cls(f.integer("index"), f.text("bdf"), f.text("root"))


@dataclass(frozen=True)
class TpGroup:
    indices: tuple[int, ...]  # CUDA indices, in the order they take in CUDA_VISIBLE_DEVICES
    roots: tuple[str, ...]  # the root complexes its GPUs are behind

    @property
    def crosses(self) -> bool:
        return len(self.roots) > 1

    def to_json(self) -> dict[str, object]:
        return {"indices": list(self.indices), "roots": list(self.roots)}

    @classmethod
    def from_json(cls, f: Fields) -> TpGroup:
        return cls(f.integers("indices"), f.texts("roots"))


@dataclass(frozen=True)
class TpSuggestion:
    tp: int
    fit: Fit
    order: tuple[int, ...]  # CUDA_VISIBLE_DEVICES: the groups one after another, then the GPUs in no group
    groups: tuple[TpGroup, ...]
    line: str  # what the report says

    @property
    def visible_devices(self) -> str:
        return ",".join(str(i) for i in self.order)

    @property
    def crossing(self) -> tuple[TpGroup, ...]:
        return tuple(g for g in self.groups if g.crosses)

    @property
    def reordered(self) -> bool:
        """The order is not CUDA's own (PCI bus order): CUDA_VISIBLE_DEVICES must be set to get it."""
        return self.order != tuple(sorted(self.order))

    def to_json(self) -> dict[str, object]:
        return {
            "tp": self.tp,
            "fit": self.fit.value,
            "cuda_visible_devices": self.visible_devices,
            "groups": [g.to_json() for g in self.groups],
            "crossing": len(self.crossing),
            "reordered": self.reordered,
            "line": self.line,
        }

    @classmethod
    def from_json(cls, f: Fields) -> TpSuggestion:
        fit = f.text("fit")
        known = {v.value: v for v in Fit}
        if fit not in known:
            raise PayloadError(f.probe, f.at("fit"), f"expected one of {', '.join(known)}, got {fit[:40]!r}")
        order = f.text("cuda_visible_devices")
        parts = order.split(",") if order else []
        if not all(p.isdigit() and len(p) <= 4 for p in parts):
            raise PayloadError(f.probe, f.at("cuda_visible_devices"), f"expected device indices, got {order[:40]!r}")
        groups = tuple(TpGroup.from_json(g) for g in f.objects("groups"))
        return cls(f.integer("tp"), known[fit], tuple(int(p) for p in parts), groups, f.text("line"))


@dataclass(frozen=True)
class TpPlan:
    """The suggestions for one node: `roots` in PCI bus order, one suggestion per tp size."""

    gpus: tuple[GpuPlace, ...]
    roots: tuple[str, ...]
    suggestions: tuple[TpSuggestion, ...]
    assumes: str = ASSUMES

    @property
    def lines(self) -> tuple[str, ...]:
        """The report's lines: each suggestion, under the assumption they rest on."""
        if not self.suggestions:
            return ()
        head = f"TP groups (CUDA indices with {self.assumes}): {len(self.gpus)} GPUs behind {_roots_said(self)}"
        return (head, *(f"  {s.line}" for s in self.suggestions))

    def suggestion(self, tp: int) -> TpSuggestion | None:
        return next((s for s in self.suggestions if s.tp == tp), None)

    def to_json(self) -> dict[str, object]:
        return {
            "assumes": self.assumes,
            "gpus": [g.to_json() for g in self.gpus],
            "roots": list(self.roots),
            "suggestions": [s.to_json() for s in self.suggestions],
        }

    @classmethod
    def from_json(cls, data: object) -> TpPlan:
        """Strict: a PayloadError names the field (`tp_groups: suggestions[0].fit: ...`)."""
        f = Fields(WHAT, data)
        return cls(
            tuple(GpuPlace.from_json(g) for g in f.objects("gpus")),
            f.texts("roots"),
            tuple(TpSuggestion.from_json(s) for s in f.objects("suggestions")),
            f.text("assumes"),
        )


def places(gpus: Iterable[SysGpu]) -> tuple[GpuPlace, ...]:
    """The GPUs numbered as CUDA numbers them with CUDA_DEVICE_ORDER=PCI_BUS_ID: by PCI address (sysfs's
    `dddd:bb:dd.f`, zero-padded lower-case hex, so text order is bus order)."""
    ordered = sorted(gpus, key=lambda g: g.bdf)
    return tuple(GpuPlace(i, g.bdf, g.host_bridge or UNKNOWN_ROOT) for i, g in enumerate(ordered))


def tp_sizes(count: int, wanted: Sequence[int] = ()) -> tuple[int, ...]:
    """The tp sizes to suggest for: `wanted` when given (the role's or the manifest's), else 2, 4 and 8 up to
    the GPU count."""
    if wanted:
        return tuple(dict.fromkeys(t for t in wanted if t >= 2))
    return tuple(t for t in TP_SIZES if t <= count)


def _by_root(gpus: Sequence[GpuPlace]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for g in gpus:
        found.setdefault(g.root, []).append(g.index)
    return found


def _roots_said(plan: TpPlan) -> str:
    counts = _by_root(plan.gpus)
    if len(counts) == 1:
        return f"one root complex ({plan.roots[0]})"
    each = ", ".join(f"{len(counts[r])} behind {r}" for r in plan.roots)
    return f"{len(counts)} root complexes ({each})"


def _indices(indices: Sequence[int]) -> str:
    return ",".join(str(i) for i in indices)


def suggest(gpus: Sequence[GpuPlace], tp: int) -> TpSuggestion:
    """The order for one tp size. Each root complex gives as many whole groups as it holds GPUs for (the most any
    order can keep behind one root: a group crosses only where a root's GPUs do not fill it); the GPUs left over
    make the groups that must cross, in bus order; GPUs that fill no group come last."""
    count = len(gpus)
    root_of = {g.index: g.root for g in gpus}
    if tp > count:
        line = f"tp {tp}: needs {tp} GPUs, the node has {count}: no group of {tp} fits"
        return TpSuggestion(tp, Fit.TOO_FEW, tuple(root_of), (), line)
    by_root = _by_root(gpus)
    kept: list[list[int]] = []
    rest: list[int] = []
    for indices in by_root.values():
        whole = len(indices) // tp
        kept += [indices[i * tp : (i + 1) * tp] for i in range(whole)]
        rest += indices[whole * tp :]
    mixed = [rest[i : i + tp] for i in range(0, len(rest) - len(rest) % tp, tp)]
    spare = rest[len(rest) - len(rest) % tp :]
    groups = tuple(TpGroup(tuple(g), tuple(dict.fromkeys(root_of[i] for i in g))) for g in (*kept, *mixed))
    order = tuple(i for g in groups for i in g.indices) + tuple(spare)
    spare_said = f"; {_indices(spare)} in no group" if spare else ""
    env = f"CUDA_VISIBLE_DEVICES={_indices(order)}"
    if len(by_root) == 1:
        line = f"tp {tp}: every GPU is behind {next(iter(by_root))}: any order keeps each group behind it"
        return TpSuggestion(tp, Fit.ONE_ROOT, order, groups, line + spare_said)
    crossing = [g for g in groups if g.crosses]
    if not crossing:
        bus = " (the PCI bus order would not)" if order != tuple(sorted(order)) else " (the PCI bus order)"
        each = "; ".join(f"{_indices(g.indices)} behind {g.roots[0]}" for g in groups)
        line = f"tp {tp}: {env}{bus} keeps each group behind one root complex: {each}{spare_said}"
        return TpSuggestion(tp, Fit.KEPT, order, groups, line)
    across = "; ".join(f"{_indices(g.indices)} across {' + '.join(g.roots)}" for g in crossing)
    if len(groups) == 1:
        line = f"tp {tp}: no order keeps the group behind one root complex: it must cross ({across}); {env}"
    else:
        line = (
            f"tp {tp}: {len(crossing)} of {len(groups)} groups must cross root complexes, whatever the order "
            f"({across}); {env} keeps the other {len(groups) - len(crossing)} behind one"
        )
    return TpSuggestion(tp, Fit.CROSSES, order, groups, line + spare_said)


def plan(gpus: Sequence[GpuPlace], wanted: Sequence[int] = ()) -> TpPlan:
    """The suggestions for every tp size (`tp_sizes`); none with fewer than two GPUs."""
    roots = tuple(dict.fromkeys(g.root for g in gpus))
    sizes = tp_sizes(len(gpus), wanted) if len(gpus) >= 2 else ()
    return TpPlan(tuple(gpus), roots, tuple(suggest(gpus, tp) for tp in sizes))
