"""Family `cuda_toolkit`: nvcc and NVRTC of the pinned CUDA release, and an sm_120 kernel built and run."""
