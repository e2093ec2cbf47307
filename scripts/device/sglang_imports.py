#!/usr/bin/env python3
"""Import the modules an SGLang server loads (HTTP server, scheduler, model runner, Llama, EAGLE-3, triton
attention) one by one and print each failure with the missing module, instead of stopping at the first: one GPU
run then names every package the carried stack still lacks. Exit 1 when any import failed."""

from __future__ import annotations

import importlib
import sys
import time
import traceback

MODULES = (
    "sgl_kernel",
    "sglang.launch_server",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.managers.scheduler",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.models.llama",
    "sglang.srt.models.llama_eagle3",
    "sglang.srt.speculative.eagle_worker_v2",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.entrypoints.openai.serving_chat",
    "sglang.srt.entrypoints.openai.serving_completions",
)


def main() -> int:
    failed = 0
    for name in MODULES:
        start = time.monotonic()
        try:
            importlib.import_module(name)
        except Exception as exc:  # every kind of import failure is a finding here
            failed += 1
            missing = getattr(exc, "name", "") if isinstance(exc, ModuleNotFoundError) else ""
            print(f"FAIL {name}: {type(exc).__name__}: {exc}" + (f" [missing: {missing}]" if missing else ""))
            print("  " + "  ".join(traceback.format_exception(exc)[-3:]).strip()[-600:])
        else:
            print(f"ok   {name} ({time.monotonic() - start:.2f} s)")
    print(f"{len(MODULES) - failed} of {len(MODULES)} imported", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
