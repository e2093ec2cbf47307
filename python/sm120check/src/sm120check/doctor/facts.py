"""Facts several checks share, computed once before the checks run (as repo-review computes its fixtures).

The CLI reads them before the first check (`local` with the manifest, then `gather` asks NVML), bounded, and
the runner hands the same frozen `NodeFacts` to every check through `Context.facts`: the GPU list NVML reported
(typed `Gpu`, or why there is none), the CUDA toolkit home FlashInfer's JIT would use, the stack venv and its
distributions, FlashInfer's version there, and the manifest they follow; when a node-health check is in the run,
the node-health probe's answer (`HealthFacts`: NVML readings per GPU, the kernel log's Xids and, for level-2
health checks, the copy and SM loads), asked once for every health check, in the background like NVML; when a
check that declares `needs_pcie` is in the run, the PCIe fabric (`PcieFacts`: IOMMU groups and mode, the bridges
above the GPUs and their ACS, the pcie_p2p fact file), read once for all of them.
A check reads facts, never another check's `data`.

This module sits below the checks and the model: it imports the NVML payload, the manifest and the child runner.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

from sm120check.doctor import child
from sm120check.doctor.gpu.nvml_info_payload import NvmlAnswer
from sm120check.doctor.gpu.payloads import NodeHealth
from sm120check.doctor.nvml_api import Gpu, NvmlInfo
from sm120check.doctor.payload import PayloadError
from sm120check.doctor.pcie import node as pcie_node
from sm120check.doctor.pcie.node import PcieFacts
from sm120check.manifest import Manifest

NVML_PROBE = "sm120check.doctor.gpu.nvml_info_probe"
NVML_TIMEOUT = 30.0  # NVML reads take well under a second; a GPU off the bus can make nvmlInit slow, not this slow
HEALTH_PROBE = "sm120check.doctor.gpu.node_health_probe"
TORCH_PROBE = "sm120check.doctor.python_stack.torch_info_probe"
# At rest the probe takes well under a second; the load takes about 1.5 s of copies and 0.5 s of SM load per GPU
# (copies stop at 2.5 s a direction even on a Gen1 x1 link): 90 s covers 8 GPUs at their slowest.
HEALTH_TIMEOUT = 90.0
DEFAULT_HOME = "/usr/local/cuda"
FLASHINFER = "flashinfer-python"


@dataclass(frozen=True)
class CudaHome:
    path: str  # "" when nothing was found
    source: str  # "CUDA_HOME", "CUDA_PATH", "which nvcc", "/usr/local/cuda" or "none"


def resolve_cuda_home(
    environ: Mapping[str, str],
    which: Callable[[str], str | None] = shutil.which,
    exists: Callable[[str], bool] = os.path.exists,
) -> CudaHome:
    """CUDA_HOME exactly as FlashInfer's JIT finds it: CUDA_HOME, CUDA_PATH, `which nvcc`, /usr/local/cuda."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if environ.get(var):
            return CudaHome(environ[var], var)
    nvcc = which("nvcc")
    if nvcc:
        return CudaHome(str(Path(nvcc).parent.parent), "which nvcc")
    if exists(DEFAULT_HOME):
        return CudaHome(DEFAULT_HOME, DEFAULT_HOME)
    return CudaHome("", "none")


def normalize(name: str) -> str:
    """PEP 503 name: "Flashinfer_Python" -> "flashinfer-python"."""
    return "-".join(name.lower().replace("_", "-").replace(".", "-").split("-"))


def venv_of(manifest: Manifest | None) -> Path:
    """The stack venv the doctor judges: the manifest's `venv`, else the interpreter running the doctor."""
    if manifest is not None and manifest.venv:
        return Path(manifest.venv)
    return Path(sys.prefix)


def site_packages(venv: Path) -> list[Path]:
    if venv.resolve() == Path(sys.prefix).resolve():
        return [Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    return sorted(p for p in venv.glob("lib/python3*/site-packages") if p.is_dir())


def distributions(venv: Path) -> dict[str, str]:
    """Installed distributions of the venv: normalized name -> version (first one on the path wins)."""
    found: dict[str, str] = {}
    paths = [str(p) for p in site_packages(venv)]
    for dist in metadata.distributions(path=paths):
        name = dist.metadata["Name"]
        if name:
            found.setdefault(normalize(name), dist.version)
    return found


def flashinfer_version(manifest: Manifest | None, installed: Mapping[str, str]) -> str:
    """flashinfer-python's version in the stack venv ("" if absent); without a manifest venv, the version the
    running interpreter imports (its whole path, not only site-packages)."""
    if manifest is not None and manifest.venv:
        return installed.get(FLASHINFER, "")
    try:
        return metadata.version(FLASHINFER)
    except metadata.PackageNotFoundError:
        return ""


@dataclass(frozen=True)
class NvmlFacts:
    """What the NVML probe said: `info` when NVML answered; else `error` (NVML does not load) or `problem` (the
    probe hung, crashed or printed nothing, with the `step` it was in and its stderr)."""

    info: NvmlInfo | None = None
    error: str = ""
    problem: str = ""
    step: str = ""
    stderr_tail: str = ""

    @property
    def why_no_gpus(self) -> str:
        if self.info is not None:
            return ""
        return f"the NVML probe {self.problem}" if self.problem else f"NVML does not load: {self.error}"


def read_nvml(timeout: float) -> NvmlFacts:
    """Run the NVML probe in its child (bounded by min(timeout, NVML_TIMEOUT)) and type its answer."""
    outcome = child.run_probe(NVML_PROBE, timeout=min(timeout, NVML_TIMEOUT))
    if not outcome.ok:
        return NvmlFacts(problem=outcome.problem, step=outcome.step, stderr_tail=outcome.stderr_tail)
    return nvml_facts(outcome.data)


def nvml_facts(data: Mapping[str, object]) -> NvmlFacts:
    """The NVML probe's JSON -> facts; a malformed answer is an NVML error naming the bad field."""
    try:
        answer = NvmlAnswer.from_json(data)
    except PayloadError as exc:
        return NvmlFacts(error=f"the NVML probe's answer is malformed: {exc}")
    return NvmlFacts(answer.info, answer.error or ("" if answer.info else "the NVML probe gave no answer"))


@dataclass(frozen=True)
class HealthPlan:
    """How the node-health probe runs: with the copy and SM loads (a level-2 health check is in the run) or at rest
    (`--no-load`: no CUDA context), on `gpus` (None: all); `exclude_tree`: the pid whose descendants are left out
    of the GPU process lists (the doctor's: its own children hold CUDA contexts)."""

    load: bool
    gpus: tuple[int, ...] | None = None
    exclude_tree: int = field(default_factory=os.getpid)

    def args(self) -> list[str]:
        out = ["--exclude-tree", str(self.exclude_tree)]
        if not self.load:
            out.append("--no-load")
        if self.gpus is not None:
            out += ["--gpus", ",".join(map(str, self.gpus))]
        return out


@dataclass(frozen=True)
class HealthFacts:
    """What the node-health probe said: `health` when it answered (even without NVML: `health.nvml_error`), else
    `problem` (it hung, crashed, printed nothing or printed a malformed answer) with its `step` and stderr."""

    health: NodeHealth | None = None
    loaded: bool = False  # it ran with the loads
    problem: str = ""
    step: str = ""
    stderr_tail: str = ""


def read_health(plan: HealthPlan, timeout: float) -> HealthFacts:
    """Run the node-health probe in its child (bounded by min(timeout, HEALTH_TIMEOUT)) and type its answer."""
    outcome = child.run_probe(HEALTH_PROBE, plan.args(), timeout=min(timeout, HEALTH_TIMEOUT))
    if not outcome.ok:
        return HealthFacts(
            loaded=plan.load, problem=outcome.problem, step=outcome.step, stderr_tail=outcome.stderr_tail
        )
    return health_facts(outcome.data, plan.load)


def health_facts(data: Mapping[str, object], loaded: bool) -> HealthFacts:
    try:
        return HealthFacts(NodeHealth.from_json(data), loaded)
    except PayloadError as exc:
        return HealthFacts(loaded=loaded, problem=f"printed a malformed answer ({exc})")


T = TypeVar("T")


def _waited(read: T | Future[T] | None) -> T | None:
    """A fact gathered in the background: its value, waiting for it (bounded by its probe's own timeout)."""
    if not isinstance(read, Future):
        return read
    while not wait([read], timeout=0.2).done:  # woken often: a signal handler in the main thread must run
        pass
    return read.result()


@dataclass(frozen=True)
class NodeFacts:
    """The inputs several checks share, computed once. NVML's answer may still be coming when the checks start
    (`gather` asks it in the background): reading `nvml` or a GPU fact waits for it, bounded by the probe's
    timeout; checks that read no GPU fact do not wait. `nvml` None: NVML was not asked (the driver check is not in
    the run, or the facts were built without it): every GPU fact is then missing, as without a driver."""

    nvml_read: NvmlFacts | Future[NvmlFacts] | None = None
    toolkit_home: CudaHome = CudaHome("", "none")
    venv: Path = field(default_factory=lambda: Path(sys.prefix))
    distributions: Mapping[str, str] = field(default_factory=dict)  # the stack venv's: normalized name -> version
    flashinfer: str = ""  # flashinfer-python's version in the stack venv, "" if absent
    manifest: Manifest | None = None
    health_read: HealthFacts | Future[HealthFacts] | None = None  # None: no health check in the run (or not asked)
    # The torch probe's outcome when it was started with the facts (the torch check is in the run): the slowest
    # child of a level-2 run then starts before the checks, not after the results the torch check reads.
    torch_read: child.ChildOutcome | Future[child.ChildOutcome] | None = None
    # The PCIe fabric (IOMMU, bridges, ACS, the pcie_p2p fact file) when a check that declares `needs_pcie` is in
    # the run.
    pcie_read: PcieFacts | Future[PcieFacts] | None = None

    @property
    def pcie(self) -> PcieFacts | None:
        """The PCIe fabric read for the run (waiting for it if it still runs); None when it was not asked."""
        return _waited(self.pcie_read)

    @property
    def torch_probe(self) -> child.ChildOutcome | None:
        """The torch probe's outcome (waiting for it if it still runs); None when it was not started early."""
        return _waited(self.torch_read)

    @property
    def health(self) -> HealthFacts | None:
        """What the node-health probe said (waiting for it if it still runs); None when it was not asked."""
        return _waited(self.health_read)

    @property
    def nvml(self) -> NvmlFacts | None:
        """What NVML said (waiting for the probe if it still runs); None when it was not asked."""
        return _waited(self.nvml_read)

    @property
    def gpus(self) -> tuple[Gpu, ...] | None:
        """The GPUs NVML lists (possibly none); None when NVML gave no list (`gpus_missing` says why)."""
        return self.nvml.info.gpus if self.nvml is not None and self.nvml.info is not None else None

    @property
    def gpus_missing(self) -> str:
        if self.nvml is None:
            return "NVML was not asked (the driver check is not in this run)"
        return self.nvml.why_no_gpus

    @property
    def venv_python(self) -> Path:
        """The stack venv's interpreter (the running one when the venv is the doctor's own)."""
        if self.venv.resolve() == Path(sys.prefix).resolve():
            return Path(sys.executable)
        return self.venv / "bin" / "python"


def needs_nvml(check: object) -> bool:
    """Whether a check reads NVML's GPU list: the driver check (which judges NVML's answer), or a check that declares
    `needs_nvml = True` (a class attribute; absent: False). NVML is asked once when any of them is in the run."""
    return getattr(check, "id", None) == "driver" or getattr(check, "needs_nvml", False) is True


def needs_pcie(check: object) -> bool:
    """Whether a check judges the PCIe fabric: it declares `needs_pcie = True` (a class attribute; absent: False)."""
    return getattr(check, "needs_pcie", False) is True


def pcie_reader(chosen: Iterable[object]) -> Callable[[], PcieFacts] | None:
    """The fabric read the run needs: one, shared by every chosen check that declares `needs_pcie`; None without."""
    return pcie_node.read if any(needs_pcie(check) for check in chosen) else None


def read_pcie(reader: Callable[[], PcieFacts] | None = None) -> PcieFacts:
    """Read the fabric (`reader`, default `pcie.node.read`); a read that raises is facts that say so
    (`pcie.node.unreadable`), never a crash."""
    try:
        return (reader or pcie_node.read)()
    except Exception as exc:  # hostile sysfs or lspci: the judges report an unreadable fabric
        return pcie_node.unreadable(f"the PCIe fabric read failed: {type(exc).__name__}: {exc}")


def pcie_of(facts: NodeFacts) -> PcieFacts:
    """The fabric read for the run; without one (tests, API callers that built no facts) it is read now."""
    gathered = facts.pcie
    return gathered if gathered is not None else read_pcie()


def local(manifest: Manifest | None = None, environ: Mapping[str, str] | None = None) -> NodeFacts:
    """The facts that need no child process: toolkit home, stack venv and its distributions, FlashInfer."""
    venv = venv_of(manifest)
    installed = distributions(venv)
    return NodeFacts(
        toolkit_home=resolve_cuda_home(os.environ if environ is None else environ),
        venv=venv,
        distributions=MappingProxyType(installed),
        flashinfer=flashinfer_version(manifest, installed),
        manifest=manifest,
    )


def torch_probe(python: str, timeout: float) -> Callable[[], child.ChildOutcome]:
    """The torch probe in `python` (the stack venv's interpreter), bounded by `timeout`: the torch check's child,
    to run in the check or ahead of it (`start`)."""
    return lambda: child.run_probe(TORCH_PROBE, timeout=timeout, python=python, env=child.probe_env())


def start(probe: Callable[[], T], name: str) -> Future[T]:
    """Run `probe` in a background thread now; the Future is what a fact holds until a check reads it."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sm120check-{name}")
    started = pool.submit(probe)
    pool.shutdown(wait=False)
    return started


def gather(
    base: NodeFacts,
    *,
    timeout: float,
    nvml: bool,
    health: HealthPlan | None = None,
    torch_probe: Callable[[], child.ChildOutcome] | Future[child.ChildOutcome] | None = None,
    pcie: Callable[[], PcieFacts] | None = None,
) -> NodeFacts:
    """`base` (the local facts) with NVML asked when `nvml` and the node-health probe run when `health` is given:
    each probe starts now, in a child bounded by min(timeout, its own limit), read by a background thread, so
    checks that need neither start at once and the two probes run beside each other and beside the checks.
    `torch_probe` (the torch check's child, when that check is in the run) starts now too, for the same reason,
    unless it was started even earlier (a Future: the CLI starts it before it imports the check catalogue).
    `pcie` (the PCIe fabric reader, `pcie_reader`: when a check that needs it is in the run) reads in the background
    too, once for all of them; a read that raises becomes facts that say the fabric is unreadable (`read_pcie`)."""
    gathered = base
    if nvml:
        gathered = replace(gathered, nvml_read=start(lambda: read_nvml(timeout), "nvml"))
    if health is not None:
        gathered = replace(gathered, health_read=start(lambda: read_health(health, timeout), "health"))
    if pcie is not None:  # sysfs, /proc/cmdline, the kernel log and one lspci per bridge: under a second
        gathered = replace(gathered, pcie_read=start(lambda: read_pcie(pcie), "pcie"))
    if torch_probe is not None:
        early = torch_probe if isinstance(torch_probe, Future) else start(torch_probe, "torch")
        gathered = replace(gathered, torch_read=early)
    return gathered
