"""Each wheel's requirements held against the manifest's other pins (pure functions over metadata).

pip's resolver sees only what it installs into the stack venv. The CUDA toolkit (assembled into its own prefix) and
the manifest's own rules (one NCCL for everything on the node, FlashInfer's companions at its version) are held
here, so a bump that pip would accept still stops when torch wants another CUDA minor than the toolkit that
JIT-compiles for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sm120check.stack import dist
from sm120check.stack.model import (
    CUDA_TOOLKIT_WHEEL,
    FLASHINFER,
    FLASHINFER_COMPANIONS,
    NCCL_WHEEL,
    Problem,
    Stack,
    WheelMetadata,
)

# The CUDA wheels in the stack venv whose minor must be the toolkit's: the runtime torch loads and the NVRTC that
# compiles for it. (Other CUDA wheels, such as a newer nvcc pulled in unpinned by a kernel library, live only in the
# venv; the toolkit the JIT uses is CUDA_HOME.)
RUNTIME_WHEELS = ("nvidia-cuda-runtime", "nvidia-cuda-nvrtc")


def _minor(version: str) -> str:
    major, minor = dist.minor(version)
    return f"{major}.{minor}"


def _plan_hint(name: str, version: str) -> str:
    return f"`sm120check stack plan --set {name}={version}` lists every pin that moves with it"


def requirement_problems(stack: Stack, wheels: Sequence[WheelMetadata]) -> list[Problem]:
    """Every requirement of the pinned wheels that the manifest's other pins break."""
    pins = stack.pins()
    components = {dist.canonical_name(n): str(v) for n, v in stack.cuda_components.items()}
    problems: list[Problem] = []
    for wheel in wheels:
        who = f"{wheel.name} {wheel.version}"
        for line in wheel.requires:
            try:
                req = dist.requirement(line)
            except ValueError:
                continue  # a URL requirement or a form pip alone reads: pip's resolution judges it
            if not req.applies() or req.name == wheel.name:
                continue
            if req.name == CUDA_TOOLKIT_WHEEL:
                problems += _toolkit_problem(stack, who, req)
            elif req.name in components and not _same_minor_or_contains(req, components[req.name]):
                problems.append(_component_problem(stack, who, req, components[req.name]))
            elif req.name in pins and not req.specifier.contains(pins[req.name]):
                problems.append(_pin_problem(stack, wheel, req, pins[req.name]))
    return problems + companion_problems(stack, pins)


def _same_minor_or_contains(req: dist.Requirement, version: str) -> bool:
    exact = req.specifier.exact()
    if exact is not None:
        return _minor(exact) == _minor(version)
    return req.specifier.contains(version)


def _toolkit_problem(stack: Stack, who: str, req: dist.Requirement) -> list[Problem]:
    exact = req.specifier.exact()
    if exact is not None and _minor(exact) == _minor(stack.cuda_version):
        return []
    if exact is None and req.specifier.contains(stack.cuda_version):
        return []
    want = f"CUDA {_minor(exact)}" if exact else f"cuda-toolkit {req.specifier.text}"
    return [
        Problem(
            wheel=who,
            requirement=req.short(),
            variable="sm120kit_cuda_version",
            pinned=stack.cuda_version,
            why=(
                f"its CUDA runtime is {want} while the toolkit that JIT-compiles for it (CUDA_HOME) is CUDA "
                f"{_minor(stack.cuda_version)}; the doctor's torch check fails on that mix"
            ),
            fix=(
                f"move the toolkit with it: sm120kit_cuda_version {exact or 'in ' + req.specifier.text} and "
                f"sm120kit_cuda_components from that cuda-toolkit's metadata ({_plan_hint(*who.split(' ', 1))}), "
                "or keep the previous pin"
            ),
        )
    ]


def _component_problem(stack: Stack, who: str, req: dist.Requirement, pinned: str) -> Problem:
    return Problem(
        wheel=who,
        requirement=req.short(),
        variable=stack.where(req.name),
        pinned=pinned,
        why=f"the toolkit's {req.name} is another CUDA minor than the wheel was built for",
        fix=f"pin the components of one CUDA release ({_plan_hint(*who.split(' ', 1))})",
    )


def _pin_problem(stack: Stack, wheel: WheelMetadata, req: dist.Requirement, pinned: str) -> Problem:
    variable = stack.where(req.name)
    exact = req.specifier.exact()
    if req.name == NCCL_WHEEL:
        return Problem(
            wheel=f"{wheel.name} {wheel.version}",
            requirement=req.short(),
            variable=variable,
            pinned=pinned,
            why="torch and everything else on the node must load one NCCL (the nccl role installs that one)",
            fix=f'set sm120kit_nccl_version to "{exact}"' if exact else f"pick an NCCL in {req.specifier.text}",
        )
    keep = f"{req.name} {exact}" if exact else f"{req.name} in {req.specifier.text}"
    return Problem(
        wheel=f"{wheel.name} {wheel.version}",
        requirement=req.short(),
        variable=variable,
        pinned=pinned,
        why=f"{wheel.name} {wheel.version} cannot be installed beside {req.name} {pinned}",
        fix=(
            f"keep {keep}, or move {wheel.name} to a release whose metadata accepts {req.name} {pinned} "
            f"({_plan_hint(req.name, pinned)})"
        ),
    )


def companion_problems(stack: Stack, versions: Mapping[str, str]) -> list[Problem]:
    """FlashInfer's companion wheels (cubin, jit-cache) at another version than flashinfer-python."""
    flashinfer = versions.get(FLASHINFER)
    if flashinfer is None:
        return []
    problems = []
    for companion in FLASHINFER_COMPANIONS:
        have = versions.get(companion)
        if have is not None and dist.public(have) != dist.public(flashinfer):
            problems.append(
                Problem(
                    wheel=f"{FLASHINFER} {flashinfer}",
                    requirement=f"{companion}=={dist.public(flashinfer)}",
                    variable=stack.where(companion),
                    pinned=have,
                    why=f"{companion} ships with each FlashInfer release at that release's version",
                    fix=f'set {stack.where(companion)} to "{dist.public(flashinfer)}"',
                )
            )
    return problems


def resolved_problems(stack: Stack, resolved: Mapping[str, str], already: Iterable[Problem] = ()) -> list[Problem]:
    """The versions pip would install, held against the toolkit and FlashInfer's companions."""
    seen = {p.variable for p in already}
    problems = []
    for name in (CUDA_TOOLKIT_WHEEL, *RUNTIME_WHEELS):
        version = resolved.get(name)
        if version is None or "sm120kit_cuda_version" in seen or _minor(version) == _minor(stack.cuda_version):
            continue
        problems.append(
            Problem(
                wheel="pip's resolution",
                requirement=f"{name}=={version}",
                variable="sm120kit_cuda_version",
                pinned=stack.cuda_version,
                why=(
                    f"the stack venv would get CUDA {_minor(version)} ({name} {version}) while the toolkit is CUDA "
                    f"{_minor(stack.cuda_version)}"
                ),
                fix=(
                    "move sm120kit_cuda_version and sm120kit_cuda_components to the release torch requires "
                    "(`sm120check stack plan` lists them), or pin the wheel that pulls it in to a CUDA "
                    f"{_minor(stack.cuda_version)} build"
                ),
            )
        )
        seen.add("sm120kit_cuda_version")
    return problems + [p for p in companion_problems(stack, resolved) if p.variable not in seen]
