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


def manifest_path() -> Path:
    return Path(os.environ.get(ENV_VAR, str(DEFAULT_PATH)))


def load(path: Path | None = None) -> Manifest:
    """Read and validate the manifest; raise ManifestError with a remedy on any problem."""
    path = path or manifest_path()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(
            f"{path} does not exist; run `ansible-playbook site.yml --tags sm120check` to write it "
            f"(or point {ENV_VAR} at a manifest)"
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path} cannot be read: {exc}; rerun the sm120check role to rewrite it") from None
    if not isinstance(raw, dict) or raw.get("schema") != 1:
        raise ManifestError(f"{path} is not a schema 1 sm120kit manifest; rerun the sm120check role")
    try:
        return Manifest(
            path=path,
            profile=str(raw["profile"]),
            cuda=dict(raw["cuda"]),
            nccl=dict(raw["nccl"]),
            driver_min=str(raw["driver_min"]),
            venv=str(raw["venv"]),
            python_packages=dict(raw.get("python_packages", {})),
            env=dict(raw.get("env", {})),
            raw=raw,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"{path} lacks or mangles field {exc}; rerun the sm120check role") from None
