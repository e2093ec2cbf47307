"""Read the manifest's pins from a stack.yml, and write a plan's moves back into it with its comments kept.

PyYAML is imported inside the functions: it is there wherever Ansible is (the control node), and the doctor never
needs it. The file is edited line by line, only the values that move; the result is read back and must equal the
original with exactly those values changed, or nothing is written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120check.stack.model import Stack

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


def load(path: Path) -> dict[str, Any]:
    try:
        data = _yaml().safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise StackFileError(f"{path}: {exc.strerror}; pass the manifest with --stack FILE") from None
    except Exception as exc:  # yaml.YAMLError, without importing it at module level
        raise StackFileError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or "sm120kit_profiles" not in data:
        raise StackFileError(
            f"{path} has no sm120kit_profiles: pass the stack manifest (inventory/group_vars/all/stack.yml)"
        )
    return data


def stack_of(data: Mapping[str, Any], profile: str | None) -> Stack:
    """The `Stack` of `profile` (default: the file's sm120kit_profile) in a loaded stack.yml."""
    profiles = data.get("sm120kit_profiles") or {}
    name = profile or str(data.get("sm120kit_profile", ""))
    if name not in profiles:
        raise StackFileError(f"profile {name!r} is not in sm120kit_profiles; use one of: {', '.join(sorted(profiles))}")
    extra = {str(k): str(v) for k, v in (data.get("sm120kit_extra_python_packages") or {}).items()}
    packages = {str(k): str(v) for k, v in ((profiles[name] or {}).get("python_packages") or {}).items()}
    return Stack(
        profile=name,
        python_packages={**packages, **extra},
        cuda_version=str(data.get("sm120kit_cuda_version", "")),
        cuda_components={str(k): str(v) for k, v in (data.get("sm120kit_cuda_components") or {}).items()},
        nccl_version=str(data.get("sm120kit_nccl_version", "")),
        cuda_apt_version=str(data.get("sm120kit_cuda_apt_version", "")),
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


def write(path: Path, before: Stack, after: Stack) -> list[Edit]:
    """Write `after`'s values into `path`; the edited file must load as the original with those values changed."""
    text = path.read_text(encoding="utf-8")
    changes = edits(before, after)
    new_text = apply(text, changes)
    loaded = _yaml().safe_load(new_text)
    if _stringify(loaded) != _stringify(_expected(_yaml().safe_load(text), changes)):
        raise StackFileError(f"{path}: the edited file would not read back as planned; nothing was written")
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(new_text, encoding="utf-8")
    partial.replace(path)
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
