"""Node health: what every GPU validator reads (PCIe link, Xids, ECC, clocks, MIG, BAR1, processes, copy bandwidth).

`nvml_health` (ctypes NVML), `load` (ctypes CUDA driver copies) and `kernel_log` run only in the child
`gpu/node_health_probe.py`; `payloads` is what that child prints; `verdicts`, `xid`, `nccl_floor` and `sglang_configs`
are pure functions the doctor's checks call. Nothing here imports torch or does work at import time.
"""
