"""The node's resolved stack manifest, written by the `sm120check` role.

Data flows one way: inventory -> roles -> node manifest -> doctor -> report. The doctor compares what
is installed and loaded on the node against this file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path("/etc/sm120kit/manifest.json")
ENV_VAR = "SM120KIT_MANIFEST"


class ManifestError(Exception):
    """The manifest is missing or cannot be read; the message names the file and the fix."""


@dataclass(frozen=True)
class Manifest:
    """Typed view of /etc/sm120kit/manifest.json (schema version 1).

    Example (abridged)::

        {"schema": 1, "sm120kit_version": "0.1.0", "profile": "core",
         "cuda": {"version": "13.0.1", "nvcc": "13.0.88", "nvrtc": "13.0.88", "home": "/opt/cuda-13.0.1",
                  "link": "/opt/cuda", "lib_dir": "/opt/cuda-13.0.1/lib"},
         "nccl": {"version": "2.30.7", "method": "wheels", "lib_dir": "..."},
         "driver_min": "580.65.06",
         "venv": "/opt/sm120kit/venv",
         "python_packages": {"nvidia-ml-py": "13.580.82"},
         "env": {"CUDA_HOME": "/opt/cuda", ...}}
    """

    path: Path
    profile: str
    cuda: Mapping[str, str]
    nccl: Mapping[str, str]
    driver_min: str
    venv: str
    python_packages: Mapping[str, str]
    env: Mapping[str, str]
    raw: Mapping[str, Any] = field(repr=False)


MAX_BYTES = 4 << 20  # a manifest is a few KiB
MAX_DEPTH = 32  # and a few levels deep


def manifest_path() -> Path:
    """$SM120KIT_MANIFEST, else the default path; an empty (or blank) variable counts as unset."""
    value = os.environ.get(ENV_VAR, "").strip()
    return Path(value) if value else DEFAULT_PATH


def _depth(text: str) -> int:
    """The deepest nesting of [ and { outside JSON strings (a bound checked before json.loads recurses)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return deepest
        elif char in "]}":
            depth -= 1
    return deepest


def _field(raw: Mapping[str, Any], name: str, kind: type, default: object = None) -> Any:
    """raw[name] as `kind` (str or dict); a ValueError naming the field otherwise."""
    if name not in raw:
        if default is not None:
            return default
        raise ValueError(f"has no `{name}` field")
    value = raw[name]
    if kind is dict:
        if not isinstance(value, dict):
            raise ValueError(f"field `{name}` must be a JSON object, not {json.dumps(value)[:80]}")
        return dict(value)
    if isinstance(value, (dict, list)) or value is None:
        raise ValueError(f"field `{name}` must be a string, not {json.dumps(value)[:80]}")
    return str(value)


def load(path: Path | None = None) -> Manifest:
    """Read and validate the manifest; raise ManifestError with a remedy on any problem."""
    path = path or manifest_path()
    fix = "rerun the sm120check role to rewrite it"
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise ManifestError(
            f"{path} does not exist; run `ansible-playbook site.yml --tags sm120check` to write it "
            f"(or point {ENV_VAR} at a manifest)"
        ) from None
    except OSError as exc:
        raise ManifestError(f"{path} cannot be read: {exc.strerror or exc}; {fix}") from None
    if len(data) > MAX_BYTES:
        raise ManifestError(f"{path} is larger than {MAX_BYTES >> 20} MiB, not a manifest; {fix}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason}); {fix}") from None
    if _depth(text) > MAX_DEPTH:
        raise ManifestError(f"{path} is nested deeper than {MAX_DEPTH} levels, not a manifest; {fix}")
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise ManifestError(f"{path} is not valid JSON ({exc}); {fix}") from None
    if not isinstance(raw, dict) or raw.get("schema") != 1:
        raise ManifestError(f"{path} is not a schema 1 sm120kit manifest; rerun the sm120check role")
    try:
        return Manifest(
            path=path,
            profile=_field(raw, "profile", str),
            cuda=_field(raw, "cuda", dict),
            nccl=_field(raw, "nccl", dict),
            driver_min=_field(raw, "driver_min", str),
            venv=_field(raw, "venv", str),
            python_packages=_field(raw, "python_packages", dict, {}),
            env=_field(raw, "env", dict, {}),
            raw=raw,
        )
    except ValueError as exc:
        raise ManifestError(f"{path} {exc}; rerun the sm120check role") from None
