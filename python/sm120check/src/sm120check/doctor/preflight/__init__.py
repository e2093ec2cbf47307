"""Family `preflight`: the platform, the driver and NVML, the GPU device nodes and persistence mode."""
