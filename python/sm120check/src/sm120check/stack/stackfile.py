"""Read the manifest's pins from a stack.yml, and write a plan's moves back into it with its comments kept.

PyYAML is imported inside the functions: it is there wherever Ansible is (the control node), and the doctor never
needs it. The file is edited line by line, only the values that move; the result is read back and must equal the
original with exactly those values changed, or nothing is written.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120check import bounded
from sm120check.stack import dist
from sm120check.stack.model import WHERE, Stack

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-]+|\"[^\"]+\"|'[^']+'):(?P<rest>.*)$")


class StackFileError(Exception):
    """The stack file cannot be read or edited: the message names the file, the value and the fix."""


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise StackFileError(
            "reading stack.yml needs PyYAML (it comes with Ansible): run from the control node's venv"
        ) from None
    return yaml


MAX_BYTES = 4 << 20  # a stack.yml is a few KiB
MAX_NODES = 100_000  # YAML nodes once every alias is expanded (a stack.yml has a few hundred)
NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")  # a package name (PEP 508); never an option


class _TooManyNodes(Exception):
    pass


def _safe_load(text: str) -> Any:
    """yaml.safe_load that refuses a document which expands to more than MAX_NODES nodes through its aliases (an
    "alias bomb": nine levels of nine aliases are 387 million nodes once read)."""
    yaml = _yaml()

    class Loader(yaml.SafeLoader):  # type: ignore[misc,name-defined]
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.expanded = 0
            self.sizes: dict[int, int] = {}

        def size(self, node: Any) -> int:
            known = self.sizes.get(id(node))
            if known is None:
                if isinstance(node, yaml.MappingNode):
                    known = 1 + sum(self.size(k) + self.size(v) for k, v in node.value)
                elif isinstance(node, yaml.SequenceNode):
                    known = 1 + sum(self.size(v) for v in node.value)
                else:
                    known = 1
                self.sizes[id(node)] = known
            return known

        def compose_node(self, parent: Any, index: Any) -> Any:
            alias = self.check_event(yaml.AliasEvent)
            node = super().compose_node(parent, index)
            self.expanded += self.size(node) if alias else 1
            if self.expanded > MAX_NODES:
                raise _TooManyNodes
            return node

    loader = Loader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_text(path: Path) -> str:
    """The file's text, bounded (a regular file of at most MAX_BYTES, UTF-8); StackFileError naming it and the fix."""
    try:
        return bounded.read_text(path, MAX_BYTES)
    except bounded.Missing as exc:
        raise StackFileError(f"{exc}; pass the manifest with --stack FILE") from None
    except bounded.Unreadable as exc:
        raise StackFileError(f"{exc}; give the stack manifest (inventory/group_vars/all/stack.yml)") from None


def parse(path: Path, text: str) -> dict[str, Any]:
    try:
        data = _safe_load(text)
    except _TooManyNodes:
        raise StackFileError(
            f"{path}: more than {MAX_NODES} YAML values once its aliases are expanded; a stack manifest has a few "
            "hundred: remove the anchors and aliases (&name, *name)"
        ) from None
    except RecursionError:
        raise StackFileError(f"{path}: nested too deeply to be a stack manifest") from None
    except Exception as exc:  # yaml.YAMLError, without importing it at module level
        raise StackFileError(f"{path} is not valid YAML: {str(exc) or type(exc).__name__}") from None
    if not isinstance(data, dict) or "sm120kit_profiles" not in data:
        raise StackFileError(
            f"{path} has no sm120kit_profiles: pass the stack manifest (inventory/group_vars/all/stack.yml)"
        )
    return data


def load(path: Path) -> dict[str, Any]:
    return parse(path, read_text(path))


def _mapping(value: object, where: str, what: str) -> dict[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise StackFileError(f"{where} is {_shown(value)}, not a mapping of {what}; fix it in {WHERE}")
    return value


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _version(value: object, where: str, pep: bool = True) -> str:
    """A pin's version: a plain scalar (a number is read as its text), a PEP 440 version when `pep`."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise StackFileError(f'{where} is {_shown(value)}, not a version; write it as a string such as "2.14.1"')
    text = str(value)
    if pep:
        try:
            dist.version(text)
        except ValueError as exc:
            raise StackFileError(f"{where}: {exc}; set it in {WHERE}") from None
    return text


def _pins(section: dict[Any, Any], where: str) -> dict[str, str]:
    out = {}
    for name, version in section.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise StackFileError(
                f"{where}: {name!r} is not a package name (letters, digits, '.', '-', '_', starting and ending with a "
                f"letter or digit); fix it in {WHERE}"
            )
        out[name] = _version(version, f"{where}['{name}']")
    return out


def stack_of(data: Mapping[str, Any], profile: str | None) -> Stack:
    """The `Stack` of `profile` (default: the file's sm120kit_profile) in a loaded stack.yml; StackFileError naming
    a value that is not what the manifest holds (a section that is not a mapping, a name that is no package name, a
    version that is not PEP 440)."""
    profiles = _mapping(data.get("sm120kit_profiles"), "sm120kit_profiles", "profile name to its python_packages")
    name = profile or data.get("sm120kit_profile", "")
    names = ", ".join(sorted(str(k) for k in profiles))
    if not isinstance(name, str) or name not in profiles:
        raise StackFileError(f"profile {name!r} is not in sm120kit_profiles; use one of: {names}")
    chosen = _mapping(profiles[name], f"sm120kit_profiles.{name}", "python_packages and its other keys")
    where = f"sm120kit_profiles.{name}.python_packages"
    packages = _pins(_mapping(chosen.get("python_packages"), where, "package to version"), where)
    extra_where = "sm120kit_extra_python_packages"
    extra = _pins(_mapping(data.get(extra_where), extra_where, "package to version"), extra_where)
    components_where = "sm120kit_cuda_components"
    return Stack(
        profile=name,
        python_packages={**packages, **extra},
        cuda_version=_version(data.get("sm120kit_cuda_version", ""), "sm120kit_cuda_version"),
        cuda_components=_pins(
            _mapping(data.get(components_where), components_where, "wheel to version"), components_where
        ),
        nccl_version=_version(data.get("sm120kit_nccl_version", ""), "sm120kit_nccl_version"),
        cuda_apt_version=_version(data.get("sm120kit_cuda_apt_version", ""), "sm120kit_cuda_apt_version", pep=False),
        extra_names=frozenset(extra),
    )


@dataclass(frozen=True)
class Edit:
    path: tuple[str, ...]  # keys from the top of the file
    value: str


def edits(before: Stack, after: Stack) -> list[Edit]:
    """The stack.yml values that differ between two stacks of one profile."""
    out = []
    for key, old, new in (
        ("sm120kit_cuda_version", before.cuda_version, after.cuda_version),
        ("sm120kit_nccl_version", before.nccl_version, after.nccl_version),
        ("sm120kit_cuda_apt_version", before.cuda_apt_version, after.cuda_apt_version),
    ):
        if old != new:
            out.append(Edit((key,), new))
    for name, version in after.cuda_components.items():
        if before.cuda_components.get(name) != version:
            out.append(Edit(("sm120kit_cuda_components", name), version))
    for name, version in after.python_packages.items():
        if before.python_packages.get(name) != version:
            if name in after.extra_names:
                out.append(Edit(("sm120kit_extra_python_packages", name), version))
            else:
                out.append(Edit(("sm120kit_profiles", after.profile, "python_packages", name), version))
    return out


def _unquote(key: str) -> str:
    return key[1:-1] if key[:1] in "\"'" and key[-1:] == key[:1] else key


def apply(text: str, changes: Sequence[Edit]) -> str:
    """`text` with each change's value replaced in place (block mappings only), comments kept."""
    lines = text.splitlines(keepends=True)
    for change in changes:
        stack: list[tuple[int, str]] = []
        for i, line in enumerate(lines):
            match = _KEY.match(line.rstrip("\n"))
            if match is None or line.lstrip().startswith("#"):
                continue
            indent = len(match["indent"])
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, _unquote(match["key"])))
            if tuple(k for _, k in stack) == change.path:
                comment = re.search(r"\s+#.*$", match["rest"])
                if not match["rest"].strip() or match["rest"].strip().startswith(("{", "[")):
                    raise StackFileError(
                        f"{'.'.join(change.path)} is not a plain value on its own line; edit it by hand to "
                        f'"{change.value}"'
                    )
                tail = comment.group(0) if comment and not match["rest"].strip().startswith(("'", '"')) else ""
                if match["rest"].strip().startswith(("'", '"')):
                    quoted = re.match(r"\s*(\"[^\"]*\"|'[^']*')(.*)$", match["rest"])
                    tail = quoted.group(2) if quoted else ""
                newline = "\n" if line.endswith("\n") else ""
                lines[i] = f'{match["indent"]}{match["key"]}: "{change.value}"{tail}{newline}'
                break
        else:
            raise StackFileError(
                f"{'.'.join(change.path)} is not a line of the file (a flow mapping or an inherited value): set it "
                f'by hand to "{change.value}"'
            )
    return "".join(lines)


def _expected(data: Mapping[str, Any], changes: Sequence[Edit]) -> dict[str, Any]:
    import copy

    out: dict[str, Any] = copy.deepcopy(dict(data))
    for change in changes:
        node = out
        for key in change.path[:-1]:
            node = node[key]
        node[change.path[-1]] = change.value
    return out


class StackChanged(StackFileError):
    """The file no longer holds the pins the plan was made from (another run wrote it meanwhile)."""


@contextlib.contextmanager
def lock(path: Path) -> Iterator[None]:
    """One `--write` at a time per file (bounded.locked: `.NAME.lock` beside it): a second run waits, then reads
    the file its predecessor wrote."""

    def waiting() -> None:
        print(f"sm120check stack plan: waiting for another run writing {path}", file=sys.stderr, flush=True)

    try:
        with bounded.locked(path, waiting=waiting):
            yield
    except OSError as exc:
        raise StackFileError(
            f"cannot lock {path} for writing ({exc.strerror or exc}); check that its directory is writable by you"
        ) from None


def write(path: Path, before: Stack, after: Stack) -> list[Edit]:
    """Write `after`'s values into `path` (hold `lock(path)` from before the plan read it); the file must still hold
    `before` (else StackChanged), and the edited file must load as the original with those values changed."""
    text = read_text(path)
    now = stack_of(parse(path, text), before.profile)
    if now.as_json() != before.as_json():
        raise StackChanged(
            f"{path} changed while the plan ran (another `stack plan --write` or an editor); nothing was written: "
            "run the plan again on the file as it is now"
        )
    changes = edits(before, after)
    new_text = apply(text, changes)
    if _stringify(_safe_load(new_text)) != _stringify(_expected(parse(path, text), changes)):
        raise StackFileError(f"{path}: the edited file would not read back as planned; nothing was written")
    try:
        bounded.write_atomic(path, new_text.encode("utf-8"), follow=True)
    except OSError as exc:
        where = exc.filename or path
        raise StackFileError(
            f"cannot write {path}: {where}: {exc.strerror or exc}; nothing was written - make the file and its "
            "directory writable, or write the plan's values by hand"
        ) from None
    return changes


def _stringify(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _stringify(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_stringify(v) for v in value]
    return str(value)


def stale_comments(text: str, before: Stack, after: Stack) -> list[str]:
    """Comment lines that still name a version the plan moved (for the user to reread)."""
    old = {v for v in (before.cuda_version, before.nccl_version) if v} | {
        str(v) for n, v in before.python_packages.items() if after.python_packages.get(n) != v
    }
    old = {v for v in old if v not in {after.cuda_version, after.nccl_version}}
    return [
        f"line {i}: {line.strip()}"
        for i, line in enumerate(text.splitlines(), 1)
        if line.lstrip().startswith("#") and any(re.search(rf"(?<![0-9.]){re.escape(v)}(?![0-9])", line) for v in old)
    ]
