"""torch (in a child process): a CUDA 13 build with sm_120 kernels, NCCL new enough for SM120, CUDA usable."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

from sm120check import versions
from sm120check.doctor import child, facts, nccl_floor, remedies
from sm120check.doctor.model import Check, Context, Result, Status
from sm120check.doctor.payload import PayloadError
from sm120check.doctor.python_stack.torch_info_payload import TorchInfo

PROBE = facts.TORCH_PROBE
NCCL_MIN = nccl_floor.floor()  # the one floor preflight also reads (nccl_floor.json): without a manifest
TORCH_PROFILE = "full"  # the shipped profile that installs torch (a manifest `profile` the torch check compares)


def torch_verdict(info: TorchInfo, toolkit_release: str, gpus_expected: bool, want_nccl: str = "") -> Result:
    """Verdict from the probe's report, CUDA_HOME's nvcc release ("" if unknown) and whether the driver shows GPUs.

    `want_nccl` is the manifest's nccl.version: torch must load exactly that NCCL (the one the nccl role installed);
    without a manifest, the SM120 floor NCCL_MIN applies.
    """
    if info.import_error:
        return Result(
            "torch",
            Status.FAIL,
            "import torch fails",
            details=info.import_error[-2000:],
            remedy=remedies.TORCH,
        )
    arch_list = list(info.arch_list)
    cuda = info.cuda or ""
    nccl = info.nccl or ""
    printed = info.to_json()
    data: dict[str, object] = {
        k: printed[k]
        for k in ("version", "cuda", "nccl", "cuda_available", "device_count", "import_s", "maps")
        if k in printed
    }
    data["arch_list"] = arch_list
    summary = f"torch {info.version} (CUDA {cuda or 'none'}, NCCL {nccl or '?'})"
    problems: list[str] = []
    if not cuda:
        problems.append("a CPU-only build")
    elif versions.parse(cuda)[0] != 13:
        problems.append(f"built for CUDA {cuda}, not 13")
    if cuda and not {"sm_120", "compute_120"} & set(arch_list):
        problems.append(f"no sm_120 or compute_120 in its arch list ({' '.join(arch_list)})")
    if nccl and want_nccl and versions.parse(nccl) != versions.parse(want_nccl):
        problems.append(f"loads NCCL {nccl}, the manifest's nccl.version is {want_nccl}")
    elif nccl and not want_nccl and (floor := nccl_floor.judge_nccl(nccl)).status == "fail":
        problems.append(f"{floor.summary} (floor {NCCL_MIN}{': ' + floor.details if floor.details else ''})")
    if problems:
        return Result("torch", Status.FAIL, f"{summary}: {'; '.join(problems)}", remedy=remedies.TORCH, data=data)
    if cuda and toolkit_release and not versions.same_release(toolkit_release, cuda):
        return Result(
            "torch",
            Status.FAIL,
            f"{summary}, but CUDA_HOME's nvcc is {toolkit_release}",
            details="extensions (FlashInfer JIT, torch cpp_extension) build with CUDA_HOME's nvcc against torch's CUDA",
            remedy=remedies.torch_toolkit(cuda),
            data=data,
        )
    if gpus_expected and not info.cuda_available:
        return Result(
            "torch",
            Status.FAIL,
            f"{summary}, but torch.cuda.is_available() is False",
            details=info.cuda_error,
            remedy=remedies.DRIVER,
            data=data,
        )
    if gpus_expected and info.op_ok is False:
        return Result("torch", Status.FAIL, f"{summary}: a CUDA tensor op returned a wrong result", data=data)
    where = f"{info.device_count} GPU(s) usable" if gpus_expected else "CUDA use not tried: no NVIDIA driver"
    return Result("torch", Status.PASS, f"{summary}, sm_120 in arch list, {where}", data=data)


def missing_torch_verdict(venv: str, profile: str) -> Result:
    """No torch in the stack venv: a FAIL when the manifest's profile is the one that installs it, else a SKIP."""
    if profile == TORCH_PROFILE:
        return Result(
            "torch",
            Status.FAIL,
            f"torch is not installed in {venv}, but the manifest's profile is {profile}, which installs it",
            remedy=remedies.TORCH,
        )
    return Result(
        "torch",
        Status.SKIP,
        f"torch is not installed in {venv} (profile {profile or 'unknown: no manifest'})",
        remedy=remedies.FULL_PROFILE,
    )


def probe(ctx: Context) -> Callable[[], child.ChildOutcome]:
    """The torch probe in the stack venv's interpreter, bounded by the doctor's child timeout, to run now or in the
    background with the facts (`early_probe`)."""
    return facts.torch_probe(str(ctx.facts.venv_python), ctx.timeout)


def early_probe(chosen: Sequence[Check], ctx: Context) -> Callable[[], child.ChildOutcome] | None:
    """The torch probe to start with the facts when the torch check is in the run and torch is installed: the
    level-2 run's slowest child then starts before the checks instead of after `toolkit` and `driver`, whose
    results the check reads only to judge the answer."""
    wanted = any(c.id == TorchCheck.id for c in chosen) and "torch" in ctx.facts.distributions
    return probe(ctx) if wanted else None


class TorchCheck:
    """torch is a CUDA 13 build with sm_120 kernels, loads the manifest's NCCL, CUDA usable, agrees with CUDA_HOME."""

    id: ClassVar[str] = "torch"
    family: ClassVar[str] = "python_stack"
    level: ClassVar[int] = 2
    requires: ClassVar[tuple[str, ...]] = ()
    uses: ClassVar[tuple[str, ...]] = ("toolkit", "driver")

    def run(self, ctx: Context) -> Result:
        venv = ctx.facts.venv
        m = ctx.manifest
        if "torch" not in ctx.facts.distributions:
            return missing_torch_verdict(str(venv), m.profile if m else "")
        outcome = ctx.facts.torch_probe or probe(ctx)()  # started with the facts, or here (API callers, tests)
        if not outcome.ok:
            return Result(
                self.id,
                Status.FAIL,
                f"the torch probe {outcome.problem}",
                details=outcome.stderr_tail[-2000:],
                remedy=remedies.TORCH,
            )
        try:
            info = TorchInfo.from_json(outcome.data)
        except PayloadError as exc:
            return Result(
                self.id, Status.FAIL, f"the torch probe printed a malformed answer: {exc}", remedy=remedies.TORCH
            )
        toolkit = ctx.results.get("toolkit")
        release = str(toolkit.data.get("release", "")) if toolkit else ""
        driver = ctx.results.get("driver")  # a driver that failed (too old) or skipped: CUDA use is not expected
        gpus = driver is not None and driver.status in (Status.PASS, Status.WARN) and bool(ctx.facts.gpus)
        return torch_verdict(info, release, gpus, m.nccl.version if m else "")


CHECKS = (TorchCheck,)
