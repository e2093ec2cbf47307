"""What a bump implies: `--set torch=2.15.0` and every pin that must move with it, read from the wheels' metadata.

A pin moves when a wheel that moved (or that you set) requires one exact version of it (`torch 2.15.0` requires
`cuda-toolkit==13.2.2`, so the toolkit and its components move to that release's). A wheel that did not move but
whose requirement the bump breaks (`sglang 0.5.23` requires `torch==2.14.1`) blocks the plan: its metadata cannot say
which release of it would accept the bump, so the plan names it and asks for `--set` on it. A plan without blockers
is then resolved by pip as preflight would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from sm120check.stack import dist, pip, resolve
from sm120check.stack.model import (
    CUDA_TOOLKIT_WHEEL,
    FLASHINFER,
    FLASHINFER_COMPANIONS,
    NCCL_WHEEL,
    Problem,
    Resolution,
    Sources,
    Stack,
    Target,
)

MAX_ROUNDS = 6  # each round moves at least one pin; a manifest has a dozen


class PlanError(Exception):
    """Bad input to the plan: the message names the value and the fix."""


@dataclass(frozen=True)
class Move:
    variable: str  # the manifest variable that changes
    old: str
    new: str
    because: str  # "you set it", or the requirement that moves it

    def line(self) -> str:
        return f"{self.variable}: {self.old} -> {self.new}  ({self.because})"


@dataclass(frozen=True)
class Plan:
    before: Stack
    after: Stack
    moves: tuple[Move, ...]
    blockers: tuple[Problem, ...]
    resolution: Resolution | None  # pip's verdict on `after`; None when blockers stopped the plan first
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.blockers and self.resolution is not None and self.resolution.status.value != "conflict"


def parse_sets(words: list[str]) -> dict[str, str]:
    """`torch=2.15.0` (or `torch==2.15.0`) -> {"torch": "2.15.0"}; PlanError naming a bad word."""
    out: dict[str, str] = {}
    for word in words:
        name, sep, version = word.replace("==", "=").partition("=")
        if not sep or not name.strip() or not version.strip():
            raise PlanError(f"--set {word!r}: write NAME=VERSION, e.g. --set torch=2.15.0")
        try:
            dist.version(version)
        except ValueError as exc:
            raise PlanError(f"--set {word!r}: {exc}") from None
        out[dist.canonical_name(name.strip())] = version.strip()
    return out


def _with(stack: Stack, name: str, version: str) -> Stack:
    """`stack` with `name` (a python package, NCCL, cuda-toolkit or a CUDA component) at `version`."""
    if name == NCCL_WHEEL:
        return replace(stack, nccl_version=version)
    if name == CUDA_TOOLKIT_WHEEL:
        return replace(stack, cuda_version=version)
    components = {dist.canonical_name(n): n for n in stack.cuda_components}
    if name in components:
        return replace(stack, cuda_components={**stack.cuda_components, components[name]: version})
    packages = {dist.canonical_name(n): n for n in stack.python_packages}
    return replace(stack, python_packages={**stack.python_packages, packages[name]: version})


def _value(stack: Stack, name: str) -> str:
    if name == CUDA_TOOLKIT_WHEEL:
        return stack.cuda_version
    components = {dist.canonical_name(n): str(v) for n, v in stack.cuda_components.items()}
    return components.get(name) or stack.pins()[name]


def _known(stack: Stack) -> set[str]:
    return {*stack.pins(), CUDA_TOOLKIT_WHEEL, *(dist.canonical_name(n) for n in stack.cuda_components)}


def _minor(version: str) -> tuple[int, int]:
    return dist.minor(version)


def _holds(name: str, spec: dist.Specifier, value: str) -> bool:
    """The toolkit is held by its minor (a CUDA 13.0 runtime beside toolkit 13.0.1 is one release line)."""
    exact = spec.exact()
    if name == CUDA_TOOLKIT_WHEEL and exact is not None:
        return _minor(exact) == _minor(value)
    return spec.contains(value)


def plan(
    stack: Stack,
    sets: Mapping[str, str],
    target: Target,
    sources: Sources,
    *,
    timeout: float = pip.DEFAULT_TIMEOUT,
    cache: Path | None = None,
) -> Plan:
    """The bump `sets` applied to `stack`, with every pin it moves, what blocks it, and pip's verdict."""
    unknown = sorted(set(sets) - _known(stack))
    if unknown:
        raise PlanError(
            f"--set {unknown[0]}: not a pin of profile '{stack.profile}' (pins: {', '.join(sorted(_known(stack)))}); "
            "add a new package to sm120kit_extra_python_packages first"
        )
    after = stack
    moves: dict[str, Move] = {}
    for name, version in sets.items():
        after = _with(after, name, version)
        if _value(stack, name) != version:
            moves[name] = Move(stack.where(name), _value(stack, name), version, "you set it")
    blockers: dict[tuple[str, str], Problem] = {}
    notes: list[str] = []
    for _ in range(MAX_ROUNDS):
        changed = False
        wanted = dict(after.pins())
        if after.cuda_version != stack.cuda_version:
            wanted[CUDA_TOOLKIT_WHEEL] = after.cuda_version
        wheels = resolve.metadata(wanted, target, sources, timeout=timeout, cache=cache)
        for wheel in wheels.values():
            moved = wheel.name in moves
            for line in wheel.requires:
                try:
                    req = dist.requirement(line)
                except ValueError:
                    continue
                if wheel.name == CUDA_TOOLKIT_WHEEL:
                    changed |= _move_component(after, stack, wheel.version, req, moves)
                    after = _components_after(after, moves)
                    continue
                if not req.applies() or req.name not in _known(after) or req.name == wheel.name:
                    continue
                value = _value(after, req.name)
                if _holds(req.name, req.specifier, value):
                    continue
                exact = req.specifier.exact()
                if moved and exact is not None and moves.get(req.name) is None:
                    after = _with(after, req.name, exact)
                    moves[req.name] = Move(
                        stack.where(req.name),
                        _value(stack, req.name),
                        exact,
                        f"{wheel.name} {wheel.version} requires {req.short()}",
                    )
                    changed = True
                else:
                    blockers[(wheel.name, req.short())] = _blocker(after, wheel.name, wheel.version, req, value, moved)
        changed |= _move_companions(stack, after, moves)
        after = _companions_after(after, moves)
        if not changed:
            break
    if after.cuda_version != stack.cuda_version and stack.cuda_apt_version:
        apt = f"{after.cuda_version}-1"
        after = replace(after, cuda_apt_version=apt)
        moves["apt"] = Move(
            "sm120kit_cuda_apt_version", stack.cuda_apt_version, apt, "the apt method's release of the toolkit"
        )
        notes.append(
            f"sm120kit_cuda_apt_version {apt} is the apt package's usual revision: with cuda_toolkit_method=apt, "
            f"check NVIDIA's repository has cuda-toolkit-{after.cuda_version.rsplit('.', 1)[0].replace('.', '-')}={apt}"
        )
    # Unmoved wheels that a later round's moves satisfy are no longer blockers.
    live = tuple(b for b in blockers.values() if not _satisfied_now(after, b))
    resolution = None if live else resolve.resolve(after, target, sources, timeout=timeout, cache=cache)
    return Plan(stack, after, tuple(moves.values()), live, resolution, tuple(notes))


def _satisfied_now(after: Stack, blocker: Problem) -> bool:
    req = dist.requirement(blocker.requirement)
    name, version = blocker.wheel.rsplit(" ", 1)
    pins = after.pins()
    if pins.get(name, version) != version:
        return False  # the wheel itself moved: its new release is judged from its own metadata
    return req.name in _known(after) and _holds(req.name, req.specifier, _value(after, req.name))


def _blocker(stack: Stack, wheel: str, version: str, req: dist.Requirement, value: str, moved: bool) -> Problem:
    variable = stack.where(req.name)
    if moved:
        fix = f"--set {req.name} to a version in {req.specifier.text}, or pick another {wheel}"
        why = f"{wheel} {version} moved, but its requirement is a range the plan cannot choose from"
    else:
        fix = (
            f"move {wheel} too (--set {wheel}=VERSION, a release whose metadata accepts {req.name} {value}), "
            f"or keep {req.name} at a version in {req.specifier.text}"
        )
        why = f"{wheel} {version} stays pinned and its metadata does not accept {req.name} {value}"
    return Problem(f"{wheel} {version}", req.short(), variable, value, why, fix)


def _move_component(after: Stack, stack: Stack, toolkit: str, req: dist.Requirement, moves: dict[str, Move]) -> bool:
    """cuda-toolkit's metadata names each component at its release (`nvidia-cuda-nvcc==13.2.86.*; extra == ...`)."""
    components = {dist.canonical_name(n): str(v) for n, v in after.cuda_components.items()}
    exact = req.specifier.exact()
    if req.name not in components or exact is None or req.name in moves or exact == components[req.name]:
        return False
    if after.cuda_version == stack.cuda_version:
        return False  # the toolkit did not move: its own metadata does not move the components
    moves[req.name] = Move(
        stack.where(req.name), components[req.name], exact, f"cuda-toolkit {toolkit} requires {req.short()}"
    )
    return True


def _components_after(after: Stack, moves: Mapping[str, Move]) -> Stack:
    for name in [dist.canonical_name(n) for n in after.cuda_components]:
        if name in moves and _value(after, name) != moves[name].new:
            after = _with(after, name, moves[name].new)
    return after


def _move_companions(stack: Stack, after: Stack, moves: dict[str, Move]) -> bool:
    if FLASHINFER not in moves:
        return False
    version = dist.public(moves[FLASHINFER].new)
    changed = False
    for companion in FLASHINFER_COMPANIONS:
        if companion in after.pins() and companion not in moves and after.pins()[companion] != version:
            moves[companion] = Move(
                stack.where(companion), after.pins()[companion], version, f"{companion} ships at {FLASHINFER}'s version"
            )
            changed = True
    return changed


def _companions_after(after: Stack, moves: Mapping[str, Move]) -> Stack:
    for companion in FLASHINFER_COMPANIONS:
        if companion in moves and after.pins().get(companion) != moves[companion].new:
            after = _with(after, companion, moves[companion].new)
    return after


def render(result: Plan) -> list[str]:
    lines = ["What moves:"] + [f"  {m.line()}" for m in result.moves] if result.moves else ["Nothing moves."]
    if result.blockers:
        lines.append("Blocked: these pins do not move with it (their metadata refuses the bump):")
        lines += [f"  {b.message()}" for b in result.blockers]
    lines += [f"Note: {n}" for n in result.notes]
    if result.resolution is not None:
        lines += resolve.render(result.resolution)
    return lines
