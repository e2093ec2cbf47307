"""The GPU readers several rooms share (doctor plumbing): NVML health (`nvml_health`, ctypes), CUDA driver copies and
loads (`load`, ctypes), the kernel log and its Xids (`kernel_log`, `xid`), what they print (`payloads`), and the
probes the facts step runs (`nvml_info_probe`, `node_health_probe`). The node_health family judges them
(doctor/node_health/), the comm family's peer probes copy with `load`, the soak samples with `nvml_health`.
Nothing here imports torch or does work at import time.
"""
