"""Probe (child process): import torch, initialise CUDA if it can, report the build and the libraries
the process really maps. Prints one JSON line.

    python -m sm120check.doctor.python_stack.torch_info_probe
"""

from __future__ import annotations

import time
import traceback
from dataclasses import replace

from sm120check.doctor import loader
from sm120check.doctor.child import emit
from sm120check.doctor.python_stack.torch_info_payload import TorchInfo


def main() -> None:
    start = time.monotonic()
    try:
        import torch
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            emit(TorchInfo(installed=False).to_json())
            return
        emit(TorchInfo(installed=True, import_error=traceback.format_exc(limit=4)).to_json())
        return
    except Exception:
        emit(TorchInfo(installed=True, import_error=traceback.format_exc(limit=4)).to_json())
        return
    info = TorchInfo(
        installed=True,
        import_s=round(time.monotonic() - start, 3),
        version=str(torch.__version__),
        cuda=torch.version.cuda,
        file=str(torch.__file__),
        arch_list=tuple(torch.cuda.get_arch_list()) if torch.version.cuda else (),
    )
    try:
        nccl = torch.cuda.nccl.version()
        info = replace(info, nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl))
    except Exception as exc:
        info = replace(info, nccl_error=f"{type(exc).__name__}: {exc}")
    try:
        available = bool(torch.cuda.is_available())
        info = replace(info, cuda_available=available)
        info = replace(info, device_count=torch.cuda.device_count() if available else 0)
        if available:
            # A real op, so the CUDA runtime and driver libraries are mapped as a server would map them.
            op_ok = float(torch.arange(8, device="cuda", dtype=torch.float32).sum().item()) == 28.0
            info = replace(info, op_ok=op_ok)
            count = torch.cuda.device_count()
            caps = tuple(".".join(map(str, torch.cuda.get_device_capability(i))) for i in range(count))
            info = replace(info, capabilities=caps)
    except Exception as exc:
        info = replace(info, cuda_error=f"{type(exc).__name__}: {exc}")
    maps = {stem: tuple(files) for stem, files in loader.self_maps().items()}
    emit(replace(info, maps=maps, seconds=round(time.monotonic() - start, 3)).to_json())


if __name__ == "__main__":
    main()
