"""Peer copies between the GPUs of a node through the CUDA driver API (ctypes on libcuda.so.1): bandwidth and latency
per ordered pair, for the level-3 check gpu_peer_bandwidth (comm/peer_bandwidth_probe.py runs this in a child).

For a pair (src, dst), with both devices' primary contexts retained: cuDeviceCanAccessPeer both ways, then
cuCtxEnablePeerAccess in each context for the other (CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED is fine; what this module
enabled it disables again). Bandwidth: cuMemcpyPeerAsync of `size` bytes (64 MiB) from a buffer on src to one on
dst, on a stream of src's context (a write: src's copy engine pushes the data as PCIe posted writes), each copy
bracketed by events on that stream, repeated until `busy_s` (at least 3 copies, at most `limit_s`); the GB/s is the
median. Read bandwidth: the same copy, same direction and buffers, issued on a stream of dst's context (a read: dst's
copy engine pulls, non-posted requests answered by completions), timed the same way; p2pmark's "reads" are issued so
(cudaMemcpyPeerAsync on the reader's stream). Writes far below reads are the posted-write collapse of
local-inference-lab/rtx6kpro hardware/collapse-report.md (node_health/verdicts.peer_pair judges it). Latency: copies
of `latency_bytes` (4 bytes), each bracketed by events, the median of `latency_copies` in microseconds (the
stream's time for the copy, not the host's launch cost).
One untimed copy of each size goes first (the first peer copy maps the peer's memory). Without peer access the same
copies still run: the driver stages them through host memory, and the pair says p2p False.
Every CUDA call is checked; a failure becomes the pair's `error`, never an exception. No multicast, no NCCL, no
clock or power changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sm120check.doctor.gpu.load import MIB, Cuda, CudaCallFailed, Held, held_context, pci_key, timed
from sm120check.doctor.gpu.nvml_health import SUCCESS, Nvml
from sm120check.doctor.gpu.payloads import PEER_NOT_MEASURED, PeerLink, PeerPair
from sm120check.doctor.nvml_api import PciInfo

SIZE = 64 * MIB
BUSY_S = 0.2  # per pair: the median of 10+ copies at PCIe Gen5 rates, 3 at least on a slow staged path
LIMIT_S = 2.0
LATENCY_BYTES = 4
LATENCY_COPIES = 100
LATENCY_LIMIT_S = 1.0
ALREADY_ENABLED = "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"
_STREAM_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING: no implicit sync with the legacy default stream
_P2P_CAPS_NVLINK = 2  # nvml.h NVML_P2P_CAPS_INDEX_NVLINK
_P2P_STATUS_OK = 0  # nvml.h NVML_P2P_STATUS_OK


@dataclass(frozen=True)
class Settings:
    """How much to copy and for how long, per pair (tests shrink the bounds)."""

    size: int = SIZE
    busy_s: float = BUSY_S
    limit_s: float = LIMIT_S
    latency_bytes: int = LATENCY_BYTES
    latency_copies: int = LATENCY_COPIES
    latency_limit_s: float = LATENCY_LIMIT_S

    @property
    def worst_s(self) -> float:
        """What a pair may take: the three loops (writes, latency, reads) at their bounds, plus a second of set-up
        and warm-up copies."""
        return 2 * self.limit_s + self.latency_limit_s + 1.0


@dataclass(frozen=True)
class PeerGpu:
    """A selected GPU: its NVML index and bus id, and its CUDA device (None: not usable, `missing` says why, else
    CUDA does not see it)."""

    index: int
    bus_id: str
    dev: int | None
    missing: str = ""


def can_access(cuda: Cuda, dev: int, peer: int) -> bool:
    value = ctypes.c_int()
    cuda.call("cuDeviceCanAccessPeer", ctypes.byref(value), dev, peer)
    return bool(value.value)


def _enable(cuda: Cuda, ctx: ctypes.c_void_p, peer: ctypes.c_void_p) -> bool:
    """Let context `ctx` reach `peer`'s memory; False when it already could. Raises CudaCallFailed otherwise."""
    cuda.call("cuCtxSetCurrent", ctx)
    try:
        cuda.call("cuCtxEnablePeerAccess", peer, 0)
    except CudaCallFailed as exc:
        if ALREADY_ENABLED in str(exc):
            return False
        raise
    return True


def _free(cuda: Cuda, ctx: ctypes.c_void_p, *held: Held) -> None:
    """Free what was made in `ctx` (handles still 0 were never made), with `ctx` current."""
    if not any(handle.value for _, handle in held):
        return
    if ctx.value:
        cuda.release("cuCtxSetCurrent", ctx)
    for func, handle in held:
        if handle.value:
            cuda.release(func, handle)


def measure_pair(
    cuda: Cuda,
    src: PeerGpu,
    dst: PeerGpu,
    *,
    nvlink: bool | None = None,
    settings: Settings = Settings(),
) -> PeerPair:
    """Copies from `src` to `dst`; never raises for CUDA errors (they become `error`), frees what it made."""
    size = settings.size
    base = PeerPair(src.index, dst.index, src.bus_id, dst.bus_id, False, None, None, nvlink=nvlink, size_bytes=size)
    if src.dev is None or dst.dev is None:
        hidden = src if src.dev is None else dst
        why = hidden.missing or f"GPU {hidden.index} ({hidden.bus_id}) is hidden from CUDA (CUDA_VISIBLE_DEVICES?)"
        return dataclasses.replace(base, error=why)
    src_ctx, dst_ctx = ctypes.c_void_p(), ctypes.c_void_p()
    src_buf, dst_buf = ctypes.c_ulonglong(), ctypes.c_ulonglong()
    stream, start, end = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    pull_stream, pull_start, pull_end = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()  # in dst's context
    retained: list[int] = []
    enabled: list[tuple[ctypes.c_void_p, ctypes.c_void_p]] = []  # (context, peer) this call enabled
    p2p, access, error = False, "", ""
    rates: list[float] = []
    reads: list[float] = []
    latencies: list[float] = []
    try:
        for dev, ctx in ((src.dev, src_ctx), (dst.dev, dst_ctx)):
            cuda.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
            retained.append(dev)
        forward, backward = can_access(cuda, src.dev, dst.dev), can_access(cuda, dst.dev, src.dev)
        if forward and backward:
            try:
                states = []
                for ctx, peer in ((src_ctx, dst_ctx), (dst_ctx, src_ctx)):
                    if _enable(cuda, ctx, peer):
                        enabled.append((ctx, peer))
                        states.append("enabled")
                    else:
                        states.append("already enabled")
                p2p = True
                access = states[0] if states[0] == states[1] else "/".join(states)
            except CudaCallFailed as exc:
                access = f"cuDeviceCanAccessPeer says yes, but {exc}"
        else:
            access = (
                f"cuDeviceCanAccessPeer: GPU {src.index} -> {dst.index} {'yes' if forward else 'no'}, "
                f"{dst.index} -> {src.index} {'yes' if backward else 'no'}"
            )
        cuda.call("cuCtxSetCurrent", dst_ctx)
        cuda.call("cuMemAlloc_v2", ctypes.byref(dst_buf), ctypes.c_size_t(size))
        cuda.call("cuCtxSetCurrent", src_ctx)
        cuda.call("cuMemAlloc_v2", ctypes.byref(src_buf), ctypes.c_size_t(size))
        cuda.call("cuStreamCreate", ctypes.byref(stream), _STREAM_NON_BLOCKING)
        cuda.call("cuEventCreate", ctypes.byref(start), 0)
        cuda.call("cuEventCreate", ctypes.byref(end), 0)

        def copier(n: int, on: ctypes.c_void_p = stream) -> Callable[[], None]:
            count = ctypes.c_size_t(n)
            return lambda: cuda.call("cuMemcpyPeerAsync", dst_buf, dst_ctx, src_buf, src_ctx, count, on)

        big, small = copier(size), copier(settings.latency_bytes)
        for warm in (big, small):  # the first peer copy maps the peer's memory: not timed
            warm()
        cuda.call("cuStreamSynchronize", stream)
        took = timed(cuda, big, stream, start, end, at_least=3, busy_s=settings.busy_s, limit_s=settings.limit_s)
        rates = [size / s / 1e9 for s in took]
        latencies = timed(
            cuda,
            small,
            stream,
            start,
            end,
            at_least=settings.latency_copies,
            busy_s=0.0,
            limit_s=settings.latency_limit_s,
        )
        cuda.call("cuCtxSetCurrent", dst_ctx)  # the read: the same copy on a stream of the destination's context
        cuda.call("cuStreamCreate", ctypes.byref(pull_stream), _STREAM_NON_BLOCKING)
        cuda.call("cuEventCreate", ctypes.byref(pull_start), 0)
        cuda.call("cuEventCreate", ctypes.byref(pull_end), 0)
        pull = copier(size, pull_stream)
        pull()
        cuda.call("cuStreamSynchronize", pull_stream)
        took = timed(
            cuda, pull, pull_stream, pull_start, pull_end, at_least=3, busy_s=settings.busy_s, limit_s=settings.limit_s
        )
        reads = [size / s / 1e9 for s in took]
    except CudaCallFailed as exc:
        error = str(exc)
    finally:
        for used in (stream, pull_stream):
            if used.value:
                cuda.release("cuStreamSynchronize", used)
        _free(
            cuda,
            src_ctx,
            ("cuEventDestroy_v2", start),
            ("cuEventDestroy_v2", end),
            ("cuStreamDestroy_v2", stream),
            ("cuMemFree_v2", src_buf),
        )
        _free(
            cuda,
            dst_ctx,
            ("cuEventDestroy_v2", pull_start),
            ("cuEventDestroy_v2", pull_end),
            ("cuStreamDestroy_v2", pull_stream),
            ("cuMemFree_v2", dst_buf),
        )
        for ctx, peer in enabled:
            cuda.release("cuCtxSetCurrent", ctx)
            cuda.release("cuCtxDisablePeerAccess", peer)
        if retained:
            cuda.release("cuCtxSetCurrent", ctypes.c_void_p(None))
        for dev in retained:
            cuda.release("cuDevicePrimaryCtxRelease_v2", dev)
    return dataclasses.replace(
        base,
        p2p=p2p,
        gbps=round(statistics.median(rates), 2) if rates else None,
        latency_us=round(statistics.median(latencies) * 1e6, 2) if latencies else None,
        access=access,
        repeats=len(rates),
        error=error,
        read_gbps=round(statistics.median(reads), 2) if reads else None,
        read_repeats=len(reads),
    )


def measure_pairs(
    cuda: Cuda,
    gpus: Sequence[PeerGpu],
    *,
    deadline: float,
    nvlink: Mapping[tuple[int, int], bool | None] | None = None,
    step: Callable[[str], None] | None = None,
    settings: Settings = Settings(),
) -> tuple[PeerPair, ...]:
    """Every ordered pair of `gpus`, one at a time (pairs behind one switch share it); a pair that could not finish
    before `deadline` (time.monotonic()) is not started and says so."""
    found: list[PeerPair] = []
    for src in gpus:
        for dst in gpus:
            if src.index == dst.index:
                continue
            link = (nvlink or {}).get((src.index, dst.index))
            if time.monotonic() + settings.worst_s > deadline:
                late = f"{settings.worst_s:.0f}"
                found.append(
                    PeerPair(
                        src.index,
                        dst.index,
                        src.bus_id,
                        dst.bus_id,
                        False,
                        None,
                        None,
                        nvlink=link,
                        size_bytes=settings.size,
                        error=f"{PEER_NOT_MEASURED}: the probe's time limit would pass first (up to {late} s a pair)",
                    )
                )
                continue
            if step is not None:
                step(f"peer copies GPU {src.index} ({src.bus_id}) -> GPU {dst.index} ({dst.bus_id})")
            found.append(measure_pair(cuda, src, dst, nvlink=link, settings=settings))
    return tuple(found)


def failed_pairs(gpus: Sequence[PeerGpu], why: str, size: int = SIZE) -> tuple[PeerPair, ...]:
    """Every ordered pair, none measured, each saying `why` (libcuda did not load, cuInit failed)."""
    return tuple(
        PeerPair(a.index, b.index, a.bus_id, b.bus_id, False, None, None, size_bytes=size, error=why)
        for a in gpus
        for b in gpus
        if a.index != b.index
    )


def measure_node(
    cuda: Cuda,
    links: Sequence[PeerLink],
    *,
    deadline: float,
    nvlink: Mapping[tuple[int, int], bool | None] | None = None,
    step: Callable[[str], None] | None = None,
    settings: Settings = Settings(),
) -> tuple[PeerPair, ...]:
    """The GPUs NVML read (`links`) matched to CUDA devices by PCI bus id, each one's primary context held across
    every pair (no context built and torn down per pair), then measure_pairs. A GPU NVML could not open, CUDA does not
    see, or whose context does not start gives its pairs that reason as their error."""
    gpus = [PeerGpu(link.index, link.bus_id, None) for link in links]
    try:
        by_bus = cuda.device_by_bus()
    except CudaCallFailed as exc:
        return failed_pairs(gpus, str(exc), settings.size)
    found: list[PeerGpu] = []
    with contextlib.ExitStack() as held:
        for gpu, link in zip(gpus, links, strict=True):
            if not link.bus_id:
                found.append(dataclasses.replace(gpu, missing=f"NVML cannot open GPU {gpu.index}: {link.status}"))
                continue
            key = pci_key(gpu.bus_id)
            dev = by_bus.get(key) if key is not None else None
            if dev is not None:
                try:
                    held.enter_context(held_context(cuda, dev))
                except CudaCallFailed as exc:
                    found.append(dataclasses.replace(gpu, missing=f"GPU {gpu.index}: no CUDA context: {exc}"))
                    continue
            found.append(dataclasses.replace(gpu, dev=dev))
        return measure_pairs(cuda, found, deadline=deadline, nvlink=nvlink, step=step, settings=settings)


# ---- NVML: each GPU's link, and whether a pair talks over NVLink --------------------------------------------------


def read_link(nvml: Nvml, index: int) -> tuple[PeerLink, ctypes.c_void_p | None]:
    """GPU `index`'s bus id and maximum PCIe link (the slot's, as pcie_link reads it), with its NVML handle."""
    handle = ctypes.c_void_p()
    code = nvml.raw("nvmlDeviceGetHandleByIndex_v2", index, ctypes.byref(handle))
    if code != SUCCESS:
        return PeerLink(index, "", None, None, nvml.status(code)), None
    pci = PciInfo()
    bus = pci.busId.decode() if nvml.raw("nvmlDeviceGetPciInfo_v3", handle, ctypes.byref(pci)) == SUCCESS else ""
    gen = nvml.uint("nvmlDeviceGetMaxPcieLinkGeneration", handle)
    width = nvml.uint("nvmlDeviceGetMaxPcieLinkWidth", handle)
    status = gen.status if not gen.ok else width.status
    return PeerLink(index, bus, gen.value, width.value, status), handle


def nvlink_between(nvml: Nvml, a: ctypes.c_void_p, b: ctypes.c_void_p) -> bool | None:
    """NVML's P2P status for the NVLink capability: True when the pair can talk over NVLink (None: NVML failed)."""
    status = ctypes.c_int()
    code = nvml.raw("nvmlDeviceGetP2PStatus", a, b, _P2P_CAPS_NVLINK, ctypes.byref(status))
    return status.value == _P2P_STATUS_OK if code == SUCCESS else None
