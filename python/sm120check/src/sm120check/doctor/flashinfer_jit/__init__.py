"""Family `flashinfer_jit`: FlashInfer's JIT cache for this node's GPUs."""
