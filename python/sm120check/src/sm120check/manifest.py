"""The node's resolved stack manifest, written by the `sm120check` role (schema 2).

Data flows one way: inventory -> roles -> node manifest -> doctor -> report. Each role publishes what it resolved
(its tasks/publish.yml), roles/sm120check/templates/manifest.json.j2 only serializes that, and the doctor compares the
node with it: every field has exactly one check that does (docs/checks.md, "The node manifest").

The contract is manifest.schema.json, shipped beside this module. The doctor runs on the standard library alone, so
`load` validates with `validate` below, a strict reader of the subset of JSON Schema that file uses (an unknown keyword
in the schema is an error, not ignored); the unit tests check both agree with the `jsonschema` package.

Example::

    {"schema": 2, "sm120kit_version": "0.1.0", "profile": "core",
     "cuda": {"version": "13.0.1", "nvcc": "13.0.88", "nvrtc": "13.0.88", "home": "/opt/cuda",
              "lib_dir": "/opt/cuda/lib64"},
     "nccl": {"version": "2.30.7", "lib_dir": "/opt/sm120kit/venv/lib/python3.12/site-packages/nvidia/nccl/lib"},
     "driver_min": "580.65.06",
     "venv": "/opt/sm120kit/venv",
     "python_packages": {"nvidia-ml-py": "13.580.82"},
     "env": {"CUDA_HOME": "/opt/cuda", ...}}
"""

from __future__ import annotations

import enum
import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from sm120check import bounded, strict_schema

DEFAULT_PATH = Path("/etc/sm120kit/manifest.json")
ENV_VAR = "SM120KIT_MANIFEST"
SCHEMA = 2
SCHEMA_FILE = "manifest.schema.json"
REWRITE = "ansible-playbook site.yml --tags sm120check"


class ErrorKind(enum.Enum):
    """Why a manifest could not be used: the doctor's `manifest` check warns on MISSING and fails on the rest."""

    MISSING = "missing"  # no file at the path
    UNREADABLE = "unreadable"  # permissions, I/O, too large, not UTF-8
    INVALID = "invalid"  # not JSON, or a field breaks the schema
    SCHEMA = "schema"  # another schema version (an older or newer sm120kit wrote it)


class ManifestError(Exception):
    """The manifest is missing or cannot be used; the message names the file and the fix, `kind` says which."""

    def __init__(self, message: str, kind: ErrorKind) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class CudaPins:
    """The toolkit the cuda_toolkit role installed."""

    version: str  # the toolkit release (13.0.1): the toolkit check compares nvcc's release
    nvcc: str  # nvidia-cuda-nvcc: the toolkit check compares `nvcc --version`
    nvrtc: str  # nvidia-cuda-nvrtc: the nvrtc check compares nvrtcVersion()
    home: str  # the stable CUDA_HOME: the toolkit check compares the resolved CUDA_HOME
    lib_dir: str  # where libnvrtc.so.13 lives: the nvrtc check compares the file the loader opens


@dataclass(frozen=True)
class NcclPins:
    """The NCCL the nccl role installed."""

    version: str  # the torch check compares torch.cuda.nccl.version()
    lib_dir: str  # the abi_libs check compares where a torch process maps libnccl from


@dataclass(frozen=True)
class Manifest:
    """Typed view of /etc/sm120kit/manifest.json (schema 2, manifest.schema.json)."""

    path: Path
    profile: str
    cuda: CudaPins
    nccl: NcclPins
    driver_min: str
    venv: str
    python_packages: Mapping[str, str]
    env: Mapping[str, str]
    raw: Mapping[str, object] = field(default_factory=dict, repr=False)  # the parsed JSON, as read
    sm120kit_version: str = ""


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


# --- manifest.schema.json, read by the strict reader (strict_schema.py) ---------------------------------------------

_QUIET = ("env",)  # values that may be tokens: never echoed in an error
SchemaViolation = strict_schema.SchemaViolation


@functools.cache
def schema() -> Mapping[str, object]:
    """manifest.schema.json as shipped in this package."""
    loaded: dict[str, object] = json.loads(resources.files(__package__).joinpath(SCHEMA_FILE).read_text("utf-8"))
    return loaded


def _schema() -> strict_schema.Schema:
    return strict_schema.Schema(SCHEMA_FILE, SCHEMA, schema(), _QUIET)


def _shown(where: str, value: object) -> str:
    return strict_schema.shown(_schema(), where, value)


def validate(raw: object) -> None:
    """Raise SchemaViolation naming the first field of `raw` that breaks manifest.schema.json."""
    strict_schema.validate(_schema(), raw)


def _obj(raw: Mapping[str, object], name: str) -> dict[str, object]:
    value = raw[name]
    assert isinstance(value, dict)  # validate() checked it
    return value


def _strs(raw: Mapping[str, object], name: str) -> dict[str, str]:
    return {k: str(v) for k, v in _obj(raw, name).items()}


class _DuplicateKey(ValueError):
    """A JSON object that names one key twice (the JSON reader would keep the last silently)."""


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result: dict[str, object] = {}
    for name, value in pairs:
        if name in result:
            raise _DuplicateKey(json.dumps(name[:80]))
        result[name] = value
    return result


def load(path: Path | None = None) -> Manifest:
    """Read the manifest, check it against the schema; raise ManifestError (its kind and the fix) if unusable."""
    path = path or manifest_path()
    fix = f"rerun the sm120check role (`{REWRITE}`) to rewrite it"
    try:  # bounded, and a regular file only: a FIFO there hung the doctor
        text = bounded.read_text(path, MAX_BYTES)
    except bounded.Missing:
        raise ManifestError(
            f"{path} does not exist; run `{REWRITE}` to write it (or point {ENV_VAR} at a manifest)",
            ErrorKind.MISSING,
        ) from None
    except bounded.Unreadable as exc:
        raise ManifestError(f"{exc}; {fix}", ErrorKind.UNREADABLE) from None
    if _depth(text) > MAX_DEPTH:
        raise ManifestError(
            f"{path} is nested deeper than {MAX_DEPTH} levels, not a manifest; {fix}", ErrorKind.INVALID
        )
    try:
        raw = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except _DuplicateKey as exc:
        raise ManifestError(f"{path} lists the key {exc} twice; {fix}", ErrorKind.INVALID) from None
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise ManifestError(f"{path} is not valid JSON ({exc}); {fix}", ErrorKind.INVALID) from None
    if not isinstance(raw, dict):
        raise ManifestError(f"{path} is not a JSON object, not an sm120kit manifest; {fix}", ErrorKind.INVALID)
    version = raw.get("schema")
    if version != SCHEMA or isinstance(version, bool):
        raise ManifestError(
            f"{path} is a schema {_shown('schema', version)} manifest; this sm120check reads schema {SCHEMA} only; "
            f"{fix} (the role installs the matching checker too)",
            ErrorKind.SCHEMA,
        )
    try:
        validate(raw)
    except SchemaViolation as exc:
        raise ManifestError(f"{path} {exc}; {fix}", ErrorKind.INVALID) from None
    cuda, nccl = _strs(raw, "cuda"), _strs(raw, "nccl")
    return Manifest(
        path=path,
        profile=str(raw["profile"]),
        cuda=CudaPins(cuda["version"], cuda["nvcc"], cuda["nvrtc"], cuda["home"], cuda["lib_dir"]),
        nccl=NcclPins(nccl["version"], nccl["lib_dir"]),
        driver_min=str(raw["driver_min"]),
        venv=str(raw["venv"]),
        python_packages=_strs(raw, "python_packages"),
        env=_strs(raw, "env"),
        raw=raw,
        sm120kit_version=str(raw["sm120kit_version"]),
    )
