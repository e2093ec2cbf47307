"""Probe (child process): read the driver through NVML (pynvml, else ctypes on libnvidia-ml.so.1).
Prints one JSON line: {"info": {...}} or {"error": "..."}; announces each step on stderr first.

    python -m sm120check.doctor.gpu.nvml_info_probe

NVML runs here, not in the doctor, so that a pynvml that hangs on import, an NVML call on a GPU that fell
off the bus or a library that segfaults ends as a verdict (the parent's timeout, the signal) instead of
hanging or killing the doctor.
"""

from __future__ import annotations

from sm120check.doctor import nvml_api
from sm120check.doctor.child import emit, step
from sm120check.doctor.gpu.nvml_info_payload import NvmlAnswer


def main() -> None:
    try:
        info = nvml_api.read(step)
    except nvml_api.NvmlUnavailable as exc:
        emit(NvmlAnswer(None, str(exc)).to_json())
        return
    emit(NvmlAnswer(info).to_json())


if __name__ == "__main__":
    main()
