"""Pure helpers for the level-3 communication checks: topology parsing, result arithmetic, FlashInfer release
knowledge and its JIT cache. Standard library only; the GPU work lives in sm120check.doctor.probes."""
