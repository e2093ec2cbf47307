"""Probe (child process): import torch, initialise CUDA if it can, report the build and the libraries
the process really maps. Prints one JSON line.

    python -m sm120check.doctor.probes.torch_info
"""

from __future__ import annotations

import time
import traceback

from sm120check.doctor import loader
from sm120check.doctor.child import emit


def main() -> None:
    start = time.monotonic()
    try:
        import torch
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            emit({"installed": False})
            return
        emit({"installed": True, "import_error": traceback.format_exc(limit=4)})
        return
    except Exception:
        emit({"installed": True, "import_error": traceback.format_exc(limit=4)})
        return
    info: dict[str, object] = {
        "installed": True,
        "import_s": round(time.monotonic() - start, 3),
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "file": torch.__file__,
        "arch_list": torch.cuda.get_arch_list() if torch.version.cuda else [],
    }
    try:
        nccl = torch.cuda.nccl.version()
        info["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception as exc:
        info["nccl_error"] = f"{type(exc).__name__}: {exc}"
    try:
        available = torch.cuda.is_available()
        info["cuda_available"] = available
        info["device_count"] = torch.cuda.device_count() if available else 0
        if available:
            # A real op, so the CUDA runtime and driver libraries are mapped as a server would map them.
            info["op_ok"] = float(torch.arange(8, device="cuda", dtype=torch.float32).sum().item()) == 28.0
            info["capabilities"] = [
                ".".join(map(str, torch.cuda.get_device_capability(i)))
                for i in range(info["device_count"])  # type: ignore[call-overload]
            ]
    except Exception as exc:
        info["cuda_error"] = f"{type(exc).__name__}: {exc}"
    info["maps"] = loader.self_maps()
    info["seconds"] = round(time.monotonic() - start, 3)
    emit(info)


if __name__ == "__main__":
    main()
