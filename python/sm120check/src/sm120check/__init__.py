"""sm120check: know what works on a CUDA 13 / SM120 serving node, and how to fix what does not."""

__version__ = "0.1.0"
