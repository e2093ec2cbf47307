"""Which tuned kernel configs an SGLang tree ships for a GPU, by the name SGLang files them under.

SGLang names the file from `torch.cuda.get_device_name().replace(" ", "_")` (0.5.23:
srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py, kernels/ops/gemm/fp8_kernel.py), e.g.
`E=161,N=192,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Max-Q_Workstation_Edition.json`. NVML and CUDA report the
same product name, so the three RTX PRO 6000 Blackwell editions (Workstation, Max-Q Workstation, Server) each need
their own files: a Max-Q config is not used on a Workstation card.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# where 0.5.23 keeps configs chosen by device_name (relative to the sglang package directory)
CONFIG_DIRS = (
    "srt/layers/moe/moe_runner/triton_utils/configs",  # fused-MoE Triton, per triton_X_Y_Z/ subfolder
    "srt/layers/moe/fused_moe_triton/configs",  # older releases
    "kernels/ops/gemm/configs",  # FP8 / INT8 block GEMM
    "srt/layers/quantization/configs",  # older releases
)


@dataclass(frozen=True)
class TunedConfigs:
    device_name: str
    files: tuple[str, ...]  # paths relative to the sglang package directory
    searched: tuple[str, ...]  # the config folders that exist in this tree


def device_name(product: str) -> str:
    """The device_name part of SGLang's config file names for this product name."""
    return product.strip().replace(" ", "_")


def find(sglang_dir: str, product: str) -> TunedConfigs:
    """Config files for `product` under an installed sglang package directory (the folder holding __init__.py)."""
    name = device_name(product)
    marker = f"device_name={name}"
    files: list[str] = []
    searched: list[str] = []
    for rel in CONFIG_DIRS:
        top = Path(sglang_dir) / rel
        if not top.is_dir():
            continue
        searched.append(rel)
        for root, _dirs, names in os.walk(top):
            for file in names:
                # the name continues with "," (dtype=...), "_down.json" or ".json": never a longer product name
                rest = file.partition(marker)[2] if marker in file else None
                if rest is not None and (rest.startswith((",", ".json", "_down.json"))):
                    files.append(str((Path(root) / file).relative_to(sglang_dir)))
    return TunedConfigs(name, tuple(sorted(files)), tuple(searched))
