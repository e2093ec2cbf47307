"""Many-to-one staggered writes through the CUDA driver API (ctypes on libcuda.so.1), for the level-3 check
gpu_peer_stress (comm/peer_stress_probe.py runs this in a child), in the spirit of p2pmark's concurrent tests
(lukealonso/p2pmark: every GPU's copies at once, each on its own stream).

For each selected GPU in turn as the target, with every GPU's primary context held: peer access both ways between
the target and each other GPU (what this module enabled it disables again after the round); per source a buffer on
the source and one on the target, a stream and two events in the source's context (the copy is a write: the
source's copy engine pushes). First each source alone: `solo_copies` (at least 3) cuMemcpyPeerAsync copies of `size`,
the median GB/s. Then the load: each source's `copies` copies are queued on its stream between two events, one
source after the other `stagger_s` apart (the starts are staggered so the copy engines do not start in lockstep;
with 16 copies a source the queues overlap for nearly all of each source's time), and every stream is waited on.
A source's loaded GB/s is its bytes over its own events' time; the aggregate is all bytes over the host's clock from
the first queued copy to the last stream's end. Without peer access the copies still run, staged by the driver
through host memory, and the source says p2p False. Every CUDA call is checked; a failure ends that target's round
as its `error`, never an exception. No kernels, no NCCL, no clock or power changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from sm120check.doctor.comm.peer_copies import ALREADY_ENABLED, PeerGpu, can_access
from sm120check.doctor.comm.peer_stress_payload import NOT_MEASURED, StressSource, StressTarget
from sm120check.doctor.gpu.load import MIB, Cuda, CudaCallFailed, pci_key, timed
from sm120check.doctor.gpu.payloads import PeerLink

SIZE = 64 * MIB
COPIES = 16  # per source under load: at 7 sources into one Gen5 x16 target, about 0.15 s of shared traffic
STAGGER_S = 0.001
SOLO_BUSY_S = 0.05
SOLO_LIMIT_S = 0.5
_STREAM_NON_BLOCKING = 1


@dataclass(frozen=True)
class StressSettings:
    """How much each source copies and for how long (tests shrink them)."""

    size: int = SIZE
    copies: int = COPIES
    stagger_s: float = STAGGER_S
    solo_busy_s: float = SOLO_BUSY_S
    solo_limit_s: float = SOLO_LIMIT_S

    def worst_s(self, sources: int) -> float:
        """What a round may take on a healthy node: each solo loop at its bound, the staggered starts, and the
        load at 2 GB/s a source (a collapsed fabric can take longer: the child's own time limit bounds that)."""
        loaded = sources * self.copies * self.size / 2e9
        return sources * (self.solo_limit_s + 0.2) + sources * self.stagger_s + loaded + 1.0


@dataclass
class _Source:
    gpu: PeerGpu
    ctx: ctypes.c_void_p
    src_buf: ctypes.c_ulonglong = dataclasses.field(default_factory=ctypes.c_ulonglong)
    dst_buf: ctypes.c_ulonglong = dataclasses.field(default_factory=ctypes.c_ulonglong)
    stream: ctypes.c_void_p = dataclasses.field(default_factory=ctypes.c_void_p)
    start: ctypes.c_void_p = dataclasses.field(default_factory=ctypes.c_void_p)
    end: ctypes.c_void_p = dataclasses.field(default_factory=ctypes.c_void_p)
    p2p: bool = False
    access: str = ""
    solo: float | None = None
    loaded: float | None = None


def _enable_both(
    cuda: Cuda, a: ctypes.c_void_p, b: ctypes.c_void_p, enabled: list[tuple[ctypes.c_void_p, ctypes.c_void_p]]
) -> str:
    """Peer access from context a to b and b to a; returns how it went and records what this call enabled."""
    states = []
    for ctx, peer in ((a, b), (b, a)):
        cuda.call("cuCtxSetCurrent", ctx)
        try:
            cuda.call("cuCtxEnablePeerAccess", peer, 0)
        except CudaCallFailed as exc:
            if ALREADY_ENABLED not in str(exc):
                raise
            states.append("already enabled")
            continue
        enabled.append((ctx, peer))
        states.append("enabled")
    return states[0] if states[0] == states[1] else "/".join(states)


def _prepare(cuda: Cuda, src: _Source, target: PeerGpu, target_ctx: ctypes.c_void_p, size: int) -> None:
    cuda.call("cuCtxSetCurrent", target_ctx)
    cuda.call("cuMemAlloc_v2", ctypes.byref(src.dst_buf), ctypes.c_size_t(size))
    cuda.call("cuCtxSetCurrent", src.ctx)
    cuda.call("cuMemAlloc_v2", ctypes.byref(src.src_buf), ctypes.c_size_t(size))
    cuda.call("cuStreamCreate", ctypes.byref(src.stream), _STREAM_NON_BLOCKING)
    cuda.call("cuEventCreate", ctypes.byref(src.start), 0)
    cuda.call("cuEventCreate", ctypes.byref(src.end), 0)


def _release(cuda: Cuda, src: _Source, target_ctx: ctypes.c_void_p) -> None:
    if src.stream.value:
        cuda.release("cuStreamSynchronize", src.stream)
    cuda.release("cuCtxSetCurrent", src.ctx)
    for func, handle in (
        ("cuEventDestroy_v2", src.start),
        ("cuEventDestroy_v2", src.end),
        ("cuStreamDestroy_v2", src.stream),
        ("cuMemFree_v2", src.src_buf),
    ):
        if handle.value:
            cuda.release(func, handle)
    if src.dst_buf.value:
        cuda.release("cuCtxSetCurrent", target_ctx)
        cuda.release("cuMemFree_v2", src.dst_buf)


def measure_target(
    cuda: Cuda,
    target: PeerGpu,
    sources: Sequence[PeerGpu],
    contexts: Mapping[int, ctypes.c_void_p],
    settings: StressSettings = StressSettings(),
    sleep: Callable[[float], None] = time.sleep,
) -> StressTarget:
    """One round into `target`; never raises for CUDA errors (they become `error`), frees what it made."""
    size = settings.size
    target_ctx = contexts[target.index]
    made = [_Source(s, contexts[s.index]) for s in sources]
    enabled: list[tuple[ctypes.c_void_p, ctypes.c_void_p]] = []
    began = time.monotonic()
    aggregate: float | None = None
    error = ""
    try:
        for src in made:
            assert target.dev is not None and src.gpu.dev is not None
            if src.gpu.dev == target.dev:  # only scripts/device/pair_machinery.py, on a machine with one GPU
                src.access = "the same GPU: device-to-device copies, no peer path"
            elif can_access(cuda, src.gpu.dev, target.dev) and can_access(cuda, target.dev, src.gpu.dev):
                src.access = _enable_both(cuda, src.ctx, target_ctx, enabled)
                src.p2p = True
            else:
                src.access = "cuDeviceCanAccessPeer says no: the driver stages the copies through the host"
            _prepare(cuda, src, target, target_ctx, size)
        count = ctypes.c_size_t(size)

        def copy(src: _Source) -> Callable[[], None]:
            return lambda: cuda.call(
                "cuMemcpyPeerAsync", src.dst_buf, target_ctx, src.src_buf, src.ctx, count, src.stream
            )

        for src in made:  # alone: the warm-up copy maps the peer's memory, then the timed ones
            copy(src)()
            cuda.call("cuStreamSynchronize", src.stream)
            took = timed(
                cuda,
                copy(src),
                src.stream,
                src.start,
                src.end,
                at_least=3,
                busy_s=settings.solo_busy_s,
                limit_s=settings.solo_limit_s,
            )
            src.solo = round(statistics.median(size / s / 1e9 for s in took), 2) if took else None
        first = time.monotonic()
        for position, src in enumerate(made):  # together, starts staggered
            if position:
                sleep(settings.stagger_s)
            cuda.call("cuEventRecord", src.start, src.stream)
            for _ in range(settings.copies):
                copy(src)()
            cuda.call("cuEventRecord", src.end, src.stream)
        for src in made:
            cuda.call("cuEventSynchronize", src.end)
        wall = time.monotonic() - first
        for src in made:
            ms = ctypes.c_float()
            cuda.call("cuEventElapsedTime", ctypes.byref(ms), src.start, src.end)
            if ms.value > 0:
                src.loaded = round(settings.copies * size / (ms.value / 1000.0) / 1e9, 2)
        if wall > 0:
            aggregate = round(len(made) * settings.copies * size / wall / 1e9, 2)
    except CudaCallFailed as exc:
        error = str(exc)
    finally:
        for src in made:
            _release(cuda, src, target_ctx)
        for ctx, peer in enabled:
            cuda.release("cuCtxSetCurrent", ctx)
            cuda.release("cuCtxDisablePeerAccess", peer)
        cuda.release("cuCtxSetCurrent", ctypes.c_void_p(None))
    found = tuple(
        StressSource(s.gpu.index, s.gpu.bus_id, s.p2p, s.solo, s.loaded, s.access, error if s.loaded is None else "")
        for s in made
    )
    return StressTarget(target.index, target.bus_id, found, aggregate, round(time.monotonic() - began, 2), error)


def _unmeasured(target: PeerGpu, sources: Sequence[PeerGpu], why: str) -> StressTarget:
    gone = tuple(StressSource(s.index, s.bus_id, False, None, None, error=why) for s in sources)
    return StressTarget(target.index, target.bus_id, gone, None, error=why)


@contextlib.contextmanager
def primary_contexts(cuda: Cuda, gpus: Sequence[PeerGpu]) -> Iterator[tuple[dict[int, ctypes.c_void_p], list[str]]]:
    """Each usable GPU's primary context (NVML index -> handle), retained for the whole stress; why the others are
    not usable."""
    contexts: dict[int, ctypes.c_void_p] = {}
    problems: list[str] = []
    retained: list[int] = []
    try:
        for gpu in gpus:
            if gpu.dev is None:
                problems.append(gpu.missing or f"GPU {gpu.index} ({gpu.bus_id}) is hidden from CUDA")
                continue
            ctx = ctypes.c_void_p()
            try:
                cuda.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), gpu.dev)
            except CudaCallFailed as exc:
                problems.append(f"GPU {gpu.index}: no CUDA context: {exc}")
                continue
            retained.append(gpu.dev)
            contexts[gpu.index] = ctx
        yield contexts, problems
    finally:
        for dev in retained:
            cuda.release("cuDevicePrimaryCtxRelease_v2", dev)


def measure_node(
    cuda: Cuda,
    links: Sequence[PeerLink],
    *,
    deadline: float,
    step: Callable[[str], None] | None = None,
    settings: StressSettings = StressSettings(),
) -> tuple[tuple[StressTarget, ...], tuple[str, ...]]:
    """Every usable GPU as the target in turn, the other usable GPUs writing to it, and why the others were left out
    of every round (NVML could not open it, CUDA does not see it, its context does not start). A round that could not
    finish before `deadline` (time.monotonic()) is not started and says so."""
    try:
        by_bus = cuda.device_by_bus()
    except CudaCallFailed as exc:
        return (), (str(exc),)
    gpus = []
    for link in links:
        key = pci_key(link.bus_id) if link.bus_id else None
        missing = "" if link.bus_id else f"NVML cannot open GPU {link.index}: {link.status}"
        gpus.append(PeerGpu(link.index, link.bus_id, by_bus.get(key) if key is not None else None, missing))
    found: list[StressTarget] = []
    with primary_contexts(cuda, gpus) as (contexts, problems):
        usable = [g for g in gpus if g.index in contexts]
        for target in usable if len(usable) >= 2 else ():
            sources = [g for g in usable if g.index != target.index]
            worst = settings.worst_s(len(sources))
            if time.monotonic() + worst > deadline:
                why = f"{NOT_MEASURED}: the probe's time limit would pass first (up to {worst:.0f} s a round)"
                found.append(_unmeasured(target, sources, why))
                continue
            if step is not None:
                step(f"many-to-one writes into GPU {target.index} ({target.bus_id}) from {len(sources)} GPUs")
            found.append(measure_target(cuda, target, sources, contexts, settings))
    return tuple(found), tuple(problems)
