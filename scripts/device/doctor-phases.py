"""When each child of `sm120check doctor --level 2` starts and ends, relative to the doctor's own start.

    PYTHONPATH=python/sm120check/src python3 scripts/device/doctor-phases.py

Prints one JSON line: the exit code, when `main` returned, the doctor's own `seconds`, each probe as
(module, start s, end s), and the torch probe's `import torch` time. For the GPU machine's speed record.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from typing import Any

T0 = time.monotonic()

from sm120check.doctor import child  # noqa: E402

log: list[tuple[str, float, float]] = []
real = child.run_probe


def run_probe(module: str, *args: Any, **kwargs: Any) -> child.ChildOutcome:
    began = time.monotonic() - T0
    outcome = real(module, *args, **kwargs)
    log.append((module.rsplit(".", 1)[-1], round(began, 3), round(time.monotonic() - T0, 3)))
    return outcome


child.run_probe = run_probe  # type: ignore[assignment]  # facts and checks call child.run_probe by attribute

from sm120check.cli import main  # noqa: E402

out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(["doctor", "--level", "2", "--json"])
ended = time.monotonic() - T0
doc = json.loads(out.getvalue())
torch = next(r for r in doc["results"] if r["id"] == "torch")
print(
    json.dumps(
        {
            "rc": code,
            "main_end": round(ended, 3),
            "inner": round(doc["seconds"], 3),
            "probes": log,
            "torch_import_s": torch["data"].get("import_s"),
        }
    )
)
