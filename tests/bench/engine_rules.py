"""The serving engines' own rules for the policy files, loaded from the engines' released code where it can run here.

- SGLang: the release wheels' `adaptive_spec_params.py` (loader, initial-step check, slot routing with CUDA-graph
  padding) and the speculative capture-size function, taken from each release's source with `ast` and executed.
  Stand-ins, each named where it is provided: a no-op `log_info_on_rank0`, an identity `resolving_view`, a
  `declare_resolution` that sets the attribute (0.5.22+ record resolutions through them; the values are the same),
  and a `SimpleNamespace` for `ServerArgs` carrying only the fields the functions read.
- vLLM: `vllm/v1/spec_decode/dynamic/utils.py` from the vllm 0.24.0 wheel (a self-contained file), executed as is.
- TensorRT-LLM: NOT its own code. Its wheel is not on PyPI (a stub that downloads from NVIDIA's index, unreachable
  here), and its config classes need torch, pydantic and its C++ bindings, so `trtllm_validate_eagle3` and
  `trtllm_draft_len_for_batch_size` below are our own transcription of its rules, by hand: a test passing against
  them says the policy file meets our reading of TensorRT-LLM's rules, not that TensorRT-LLM accepted it. If
  TensorRT-LLM changes these rules, nothing here notices. Transcribed from (TRTLLM_SOURCES):
  - tensorrt_llm/llmapi/llm_args.py at commit 0004396720054fd8e205cbf616f21f0b57c6b412 (the validators);
  - tensorrt_llm/_torch/speculative/utils.py::get_draft_len_for_batch_size: commit unknown and release version
    unknown (read from a stored copy of the file that names no commit; at 0004396 no copy of that file was stored).
"""

from __future__ import annotations
import __future__

import ast
import bisect
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lab.sglang_releases import release_dir

_FLAGS = __future__.annotations.compiler_flag  # the releases' files start with `from __future__ import annotations`


def _defs(tree: ast.Module, names: set[str]) -> list[ast.stmt]:
    """Top-level functions, classes and assignments of `tree` named in `names`, in source order."""
    out: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in names:
            out.append(node)
        elif isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id in names for t in targets):
                out.append(node)
    return out


class _DropSGLangImports(ast.NodeTransformer):
    """Removes `from sglang... import X` inside functions; X is provided from the same release instead."""

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST | None:
        return None if (node.module or "").startswith("sglang") else node


def _exec(nodes: list[ast.stmt], scope: dict[str, Any], filename: str) -> dict[str, Any]:
    module = ast.fix_missing_locations(_DropSGLangImports().visit(ast.Module(body=nodes, type_ignores=[])))
    exec(compile(module, filename, "exec", flags=_FLAGS, dont_inherit=True), scope)
    return scope


def _log_info_on_rank0(logger: logging.Logger, message: str) -> None:
    """Stand-in for sglang.srt.utils.log_info_on_rank0 (logging only)."""


def _declare_resolution(server_args: Any, _source: str, **values: Any) -> None:
    """Stand-in for sglang.srt.arg_groups.overrides.declare_resolution: the resolved values, set on the args."""
    for key, value in values.items():
        setattr(server_args, key, value)


def _resolving_view(server_args: Any) -> Any:
    """Stand-in for sglang.srt.arg_groups.overrides.resolving_view: the args themselves."""
    return server_args


@dataclass(frozen=True)
class SGLangRelease:
    version: str
    adaptive_params: Callable[..., Any]  # AdaptiveSpeculativeParams(initial_steps, cfg_path)
    resolve_candidate_steps: Callable[[str | None], list[int]]
    capture_sizes_fn: Callable[..., list[int]]
    capture_is_method: bool  # 0.5.13-0.5.16: a ServerArgs method; 0.5.22+: a function of (server_args, max_bs)
    capture_takes_max_bs: bool  # 0.5.13 reads self.cuda_graph_max_bs instead
    init_steps_fn: Callable[..., Any]
    init_steps_kind: str  # "validate" (0.5.13: (initial_steps, cfg_path)) or "hook" (0.5.14+: (server_args))

    def capture_sizes(self, max_bs: int, padding: bool = True) -> list[int]:
        """The release's speculative decode CUDA-graph batch sizes for --cuda-graph-max-bs `max_bs`."""
        args = SimpleNamespace(  # stand-in for ServerArgs: the fields the function reads
            disable_cuda_graph_padding=not padding, speculative_algorithm="EAGLE3", cuda_graph_max_bs=max_bs
        )
        if self.capture_takes_max_bs:
            return list(self.capture_sizes_fn(args, max_bs))
        return list(self.capture_sizes_fn(args))

    def check_initial_steps(self, steps: int, cfg_path: str) -> int:
        """Raises the release's ValueError when --speculative-num-steps `steps` is not allowed with this file;
        returns the speculative_num_draft_tokens it resolves (0.5.14+) or steps + 1."""
        if self.init_steps_kind == "validate":
            self.init_steps_fn(steps, cfg_path)
            return steps + 1
        args = SimpleNamespace(  # stand-in for ServerArgs: the fields the hook reads and resolves
            speculative_adaptive_config=cfg_path,
            speculative_eagle_topk=1,
            speculative_num_steps=steps,
            speculative_num_draft_tokens=None,
        )
        self.init_steps_fn(args)
        return int(args.speculative_num_draft_tokens)


def sglang_release(version: str) -> SGLangRelease:
    root = release_dir(version) / "sglang" / "srt"
    adaptive_path = root / "speculative" / "adaptive_spec_params.py"
    tree = ast.parse(adaptive_path.read_text(encoding="utf-8"))
    names = {
        "DEFAULT_ADAPTIVE_CONFIG",
        "_load_adaptive_config",
        "resolve_candidate_steps_from_config",
        "validate_adaptive_initial_steps",
        "AdaptiveStepSlot",
        "AdaptiveSpeculativeParams",
    }
    scope: dict[str, Any] = {
        "__name__": f"sglang_{version.replace('.', '_')}_adaptive_spec_params",
        "json": json,
        "bisect": bisect,
        "math": math,
        "cached_property": cached_property,
        "logger": logging.getLogger("sglang-release-stand-in"),
        "log_info_on_rank0": _log_info_on_rank0,
    }
    adaptive = _exec(_defs(tree, names), scope, str(adaptive_path))
    capture_fn, is_method, takes_max_bs = _capture_function(root)
    if "validate_adaptive_initial_steps" in adaptive:
        init_fn, kind = adaptive["validate_adaptive_initial_steps"], "validate"
    else:
        hook_path = root / "arg_groups" / "speculative_hook.py"
        hook_scope: dict[str, Any] = {
            "__name__": "speculative_hook",
            "resolve_candidate_steps_from_config": adaptive["resolve_candidate_steps_from_config"],
            "resolving_view": _resolving_view,
            "declare_resolution": _declare_resolution,
        }
        hook_tree = ast.parse(hook_path.read_text(encoding="utf-8"))
        init_fn = _exec(_defs(hook_tree, {"_init_adaptive_speculative_params"}), hook_scope, str(hook_path))[
            "_init_adaptive_speculative_params"
        ]
        kind = "hook"
    return SGLangRelease(
        version,
        adaptive["AdaptiveSpeculativeParams"],
        adaptive["resolve_candidate_steps_from_config"],
        capture_fn,
        is_method,
        takes_max_bs,
        init_fn,
        kind,
    )


def _capture_function(root: Path) -> tuple[Callable[..., list[int]], bool, bool]:
    """The release's speculative capture-size function: a top-level function in arg_groups/cuda_graph_hook.py
    (0.5.22+) or a ServerArgs method in server_args.py (0.5.13-0.5.16)."""
    hook = root / "arg_groups" / "cuda_graph_hook.py"
    if hook.is_file():
        tree = ast.parse(hook.read_text(encoding="utf-8"))
        found = _defs(tree, {"generate_decode_cuda_graph_batch_sizes"})
        if found:
            scope = _exec(found, {"__name__": "cuda_graph_hook", "resolving_view": _resolving_view}, str(hook))
            return scope["generate_decode_cuda_graph_batch_sizes"], False, True
    server_args = root / "server_args.py"
    tree = ast.parse(server_args.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    for name in ("_generate_decode_cuda_graph_batch_sizes", "_generate_cuda_graph_batch_sizes"):
        method = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
        if method is not None:
            scope = _exec([method], {"__name__": "server_args"}, str(server_args))
            return scope[name], True, len(method.args.args) == 2
    raise AssertionError(f"no speculative capture-size function in {root}")


# --- vLLM --------------------------------------------------------------------------------------------------------

VLLM_VERSION = "0.24.0"
VLLM_SEED_WHEEL = Path("/tmp/vl/vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl")  # seeds the cache when present
VLLM_FILES = ("vllm/v1/spec_decode/dynamic/utils.py", "vllm/config/vllm.py", "vllm/config/speculative.py")


def vllm_cache() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "sm120kit" / "vllm"


def vllm_release_dir(version: str = VLLM_VERSION) -> Path:
    """The few files of the vllm wheel the tests read, extracted once from the wheel (downloaded once with
    `pip download --no-deps`, outside the checkout)."""
    target = vllm_cache() / version
    if all((target / f).is_file() for f in VLLM_FILES):
        return target
    wheels = vllm_cache() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    if not any(wheels.glob(f"vllm-{version}-*.whl")):
        if version == VLLM_VERSION and VLLM_SEED_WHEEL.is_file():
            shutil.copy(VLLM_SEED_WHEEL, wheels / VLLM_SEED_WHEEL.name)
        else:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), f"vllm=={version}"],
                check=True,
                timeout=600,
            )
    wheel = sorted(wheels.glob(f"vllm-{version}-*.whl"))[0]
    partial = vllm_cache() / f".{version}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(wheel) as archive:
        for name in VLLM_FILES:
            archive.extract(name, partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


@dataclass(frozen=True)
class VllmRelease:
    version: str
    root: Path
    validate: Callable[[object], list[tuple[int, int, int]]]  # validate_and_normalize_dynamic_sd_schedule
    lookup: Callable[[object, int, int], list[int]]  # build_dynamic_sd_schedule_lookup

    def text(self, rel: str) -> str:
        return (self.root / rel).read_text(encoding="utf-8")


def vllm_release(version: str = VLLM_VERSION) -> VllmRelease:
    root = vllm_release_dir(version)
    path = root / "vllm/v1/spec_decode/dynamic/utils.py"
    scope: dict[str, Any] = {"__name__": "vllm_dynamic_sd_utils"}
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec", dont_inherit=True), scope)
    return VllmRelease(
        version, root, scope["validate_and_normalize_dynamic_sd_schedule"], scope["build_dynamic_sd_schedule_lookup"]
    )


# --- TensorRT-LLM (transcribed) ----------------------------------------------------------------------------------

TRTLLM_COMMIT = "0004396720054fd8e205cbf616f21f0b57c6b412"
# What each transcription was read from: the file and the commit ("unknown" where the source named none).
TRTLLM_SOURCES = {
    "trtllm_validate_eagle3": f"NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py @ {TRTLLM_COMMIT}",
    "trtllm_draft_len_for_batch_size": (
        "NVIDIA/TensorRT-LLM tensorrt_llm/_torch/speculative/utils.py::get_draft_len_for_batch_size @ unknown commit"
    ),
}


class TrtllmConfigError(ValueError):
    pass


def trtllm_validate_eagle3(spec: dict[str, Any]) -> dict[int, int]:
    """`speculative_config` of decoding_type Eagle3 as TensorRT-LLM validates it; returns the sorted schedule.

    Our transcription (not TensorRT-LLM's code) of NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py @
    0004396720054fd8e205cbf616f21f0b57c6b412:
    field types of `DecodingBaseConfig` (max_draft_len NonNegativeInt, max_concurrency PositiveInt,
    draft_len_schedule dict[int, int], StrictBaseModel: no unknown keys here), then its validators
    `validate_draft_len_schedule_and_sort`, `validate_max_concurrency_and_draft_len_schedule_mutually_exclusive`,
    and `EagleDecodingConfig.validate_eagle_config` (max_draft_len > 0) and `validate_speculative_model`."""
    known = {"decoding_type", "max_draft_len", "speculative_model", "speculative_model_dir", "max_concurrency",
             "draft_len_schedule", "max_total_draft_tokens", "eagle3_one_model"}  # fmt: skip
    if unknown := set(spec) - known:
        raise TrtllmConfigError(f"keys this check does not know: {sorted(unknown)}")
    if spec.get("decoding_type") != "Eagle3":
        raise TrtllmConfigError(f"decoding_type {spec.get('decoding_type')!r} is not 'Eagle3'")
    max_draft_len = spec.get("max_draft_len")
    if max_draft_len is not None and (not isinstance(max_draft_len, int) or max_draft_len < 0):
        raise TrtllmConfigError(f"max_draft_len {max_draft_len!r} is not a NonNegativeInt")
    max_concurrency = spec.get("max_concurrency")
    if max_concurrency is not None and (not isinstance(max_concurrency, int) or max_concurrency <= 0):
        raise TrtllmConfigError(f"max_concurrency {max_concurrency!r} is not a PositiveInt")
    schedule = spec.get("draft_len_schedule")
    if schedule is not None:
        if not isinstance(schedule, dict) or not all(
            isinstance(k, int) and isinstance(v, int) for k, v in schedule.items()
        ):
            raise TrtllmConfigError(f"draft_len_schedule {schedule!r} is not a dict[int, int]")
        # validate_draft_len_schedule_and_sort
        for batch_size, draft_len in schedule.items():
            if batch_size < 1:
                raise TrtllmConfigError(f"draft_len_schedule: batch size threshold must be >= 1, got {batch_size}")
            if draft_len < 0:
                raise TrtllmConfigError(f"draft_len_schedule: draft length must be >= 0, got {draft_len}")
        smallest = min(schedule.keys())
        if max_draft_len is not None and schedule[smallest] != max_draft_len:
            raise TrtllmConfigError(
                f"draft_len_schedule[{smallest}] must equal max_draft_len because it is the smallest batch-size key. "
                f"Got schedule[{smallest}]={schedule[smallest]}, but max_draft_len={max_draft_len}."
            )
        if max_draft_len is not None:
            for batch_size, draft_len in schedule.items():
                if draft_len > max_draft_len:
                    raise TrtllmConfigError(
                        "draft_len_schedule: all draft lengths must be <= max_draft_len. "
                        f"Got draft_len={draft_len} for batch_size={batch_size}, but max_draft_len={max_draft_len}."
                    )
        schedule = dict(sorted(schedule.items()))
    # validate_max_concurrency_and_draft_len_schedule_mutually_exclusive
    if max_concurrency is not None and schedule is not None:
        raise TrtllmConfigError(
            "max_concurrency and draft_len_schedule are mutually exclusive. Use max_concurrency for a simple "
            "speculation cutoff, or draft_len_schedule for dynamic draft-length control."
        )
    if max_concurrency is not None and max_draft_len is not None:
        schedule = {int(max_concurrency): int(max_draft_len)}
    # EagleDecodingConfig.validate_eagle_config, validate_speculative_model
    if max_draft_len is None or max_draft_len == 0:
        raise TrtllmConfigError("max_draft_len must be > 0 for Eagle")
    if spec.get("speculative_model", spec.get("speculative_model_dir")) is None:
        raise TrtllmConfigError("Draft model must be provided for EAGLE")
    return schedule or {}


def trtllm_draft_len_for_batch_size(schedule: dict[int, int] | None, batch_size: int, max_draft_len: int) -> int:
    """Our transcription (not TensorRT-LLM's code) of NVIDIA/TensorRT-LLM
    tensorrt_llm/_torch/speculative/utils.py::get_draft_len_for_batch_size, commit and release unknown (read from a
    stored copy that names no commit): keys are upper bounds, the first key >=
    batch_size gives the draft length, batches above every key draft 0. llm_args.py @ 0004396... documents the same
    ({4:4, 8:2, 32:1}: 1-4 -> 4, 5-8 -> 2, 9-32 -> 1, 33+ -> 0)."""
    if schedule is None:
        return max_draft_len
    keys = list(schedule.keys())
    idx = bisect.bisect_left(keys, batch_size)
    if idx < len(keys):
        return schedule[keys[idx]]
    return 0
