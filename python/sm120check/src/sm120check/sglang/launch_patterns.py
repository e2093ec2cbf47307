"""The SGLang log lines that say whether a launched feature ran, read from the releases' own source.

SGLang degrades quietly: it logs a warning and carries on when the FlashInfer workspace preflight fails, when torch
symmetric memory turns itself off, when adaptive speculation cannot run, and its server-argument rules switch CUDA
graphs or fusion off before the model loads. tests/sglang/test_launch_verify.py checks every row against the releases
it names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from sm120check.doctor import remedies
from sm120check.sglang.launch_terms import Expectation, Sign

TABLE_RELEASES = ("0.5.9", "0.5.23")  # the releases the table was read from and is tested against (first, last)

_PATCH = (
    f"run `sm120check sglang patch` (role sglang_sm120: `{remedies.tags('sglang_sm120')}`), then restart the server"
)
_SCAN = "run `sm120check sglang scan` to see what keeps this SGLang off SM120"
_FUSION_DOCTOR = "`sm120check doctor --level 3 --select allreduce_fusion` runs the same fusion path outside SGLang"


@dataclass(frozen=True)
class LogPattern:
    """One line SGLang prints: what it means for which expectation, where it lives, and the fix."""

    id: str
    expectation: Expectation | None  # None for START
    sign: Sign
    regex: str  # searched in each line; named groups are reported as details
    meaning: str
    seen: tuple[str, str]  # first and last release (of those read) whose source prints it
    files: tuple[str, ...]  # where it lives in those releases, relative to the sglang package
    fix: str = ""

    @property
    def first(self) -> str:
        return self.seen[0]

    @property
    def last(self) -> str:
        return self.seen[1]

    @property
    def compiled(self) -> re.Pattern[str]:
        return re.compile(self.regex)  # the re module caches it


_FUSION_FILE = ("srt/layers/flashinfer_comm_fusion.py",)
_SYMM_FILE = ("srt/distributed/device_communicators/torch_symm_mem.py",)
_ARGS_FILES = (
    "srt/server_args.py",
    "srt/arg_groups/overrides.py",
    "srt/arg_groups/attention_hook.py",
    "srt/arg_groups/moe_hook.py",
)

LOG_PATTERNS: tuple[LogPattern, ...] = (
    LogPattern(
        id="server-start",
        expectation=None,
        sign=Sign.START,
        regex=r"\bserver_args=",
        meaning="the launcher logged its arguments: a new server run starts at this line",
        seen=("0.5.9", "0.5.23"),
        files=("srt/entrypoints/engine.py",),
    ),
    LogPattern(
        id="server-ready",
        expectation=None,
        sign=Sign.READY,
        regex=r"The server is fired up and ready to roll!",
        meaning="the warmup request passed: the startup of this run is complete",
        seen=("0.5.9", "0.5.23"),
        files=("srt/entrypoints/http_server.py",),
    ),
    LogPattern(
        id="fusion-preflight-probe",
        expectation=Expectation.FUSION,
        sign=Sign.DEGRADED,
        regex=r"FlashInfer workspace preflight probe failed \((?P<error>.*)\)\. Skipping allreduce fusion\.",
        meaning="the workspace preflight (multicast granularity, cuMemCreate probe) raised on this rank: no fusion",
        seen=("0.5.13", "0.5.23"),
        files=_FUSION_FILE,
        fix=f"the preflight asks for multicast granularity, which PCIe GPUs without multicast refuse: {_PATCH}. "
        f"{_FUSION_DOCTOR}",
    ),
    LogPattern(
        id="fusion-preflight-vote",
        expectation=Expectation.FUSION,
        sign=Sign.DEGRADED,
        regex=r"FlashInfer workspace preflight: cuMemCreate probe failed on at least one rank\. Skipping allreduce",
        meaning="the ranks voted: one rank's preflight failed, so every rank skips fusion",
        seen=("0.5.13", "0.5.23"),
        files=_FUSION_FILE,
        fix="the rank whose probe failed logged 'FlashInfer workspace preflight probe failed (...)' with the reason; "
        f"if it is the multicast query: {_PATCH}",
    ),
    LogPattern(
        id="fusion-workspace-failed",
        expectation=Expectation.FUSION,
        sign=Sign.DEGRADED,
        regex=r"Failed to initialize FlashInfer workspace(?: \(backend=[^)]*\))?: (?P<error>.*)\. "
        r"Disabling flashinfer allreduce fusion permanently",
        meaning="FlashInfer raised while creating the allreduce workspace; fusion is off for the life of the server",
        seen=("0.5.10", "0.5.23"),
        files=_FUSION_FILE,
        fix=f"the error is in the line; {_FUSION_DOCTOR} and shows the kernel or IPC failure; SM120 needs "
        f"FlashInfer >= 0.6.17 ({remedies.PYTHON_STACK})",
    ),
    LogPattern(
        id="fusion-disabled-globally",
        expectation=Expectation.FUSION,
        sign=Sign.DEGRADED,
        regex=r"FlashInfer allreduce fusion disabled globally because workspace initialization failed",
        meaning="another rank failed to create its workspace, so all ranks turned fusion off",
        seen=("0.5.13", "0.5.23"),
        files=_FUSION_FILE,
        fix="the failing rank logged 'Failed to initialize FlashInfer workspace' or a preflight line with the reason",
    ),
    LogPattern(
        id="fusion-api-missing",
        expectation=Expectation.FUSION,
        sign=Sign.DEGRADED,
        regex=r"flashinfer\.comm (?:unified allreduce_fusion API |allreduce_fusion API |)is not available",
        meaning="the installed FlashInfer lacks the flashinfer.comm allreduce-fusion API: SGLang uses plain allreduce",
        seen=("0.5.9", "0.5.23"),
        files=_FUSION_FILE,
        fix=f"install the FlashInfer the stack pins ({remedies.PYTHON_STACK}); SM120 needs >= 0.6.17",
    ),
    LogPattern(
        id="fusion-comm-missing",
        expectation=Expectation.FUSION,
        sign=Sign.DEGRADED,
        regex=r"FlashInfer comm not available, skipping workspace initialization",
        meaning="flashinfer.comm did not import, so no fusion workspace was created",
        seen=("0.5.9", "0.5.23"),
        files=_FUSION_FILE,
        fix=f"install the FlashInfer the stack pins ({remedies.PYTHON_STACK}); SM120 needs >= 0.6.17",
    ),
    LogPattern(
        id="fusion-backend-gate",
        expectation=Expectation.FUSION,
        sign=Sign.DEGRADED,
        regex=r"FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs",
        meaning="the fusion backend resolver refuses GPUs other than SM90/SM10X (the server stops)",
        seen=("0.5.14", "0.5.23"),
        files=_FUSION_FILE,
        fix=f"{_PATCH}; or leave fusion off (sglang_server_allreduce_fusion: off)",
    ),
    LogPattern(
        id="fusion-deterministic",
        expectation=Expectation.FUSION,
        sign=Sign.DEGRADED,
        regex=r"Disable --(?:enable-flashinfer-allreduce-fusion|flashinfer-allreduce-fusion-backend) "
        r"because deterministic inference is enabled",
        meaning="deterministic inference switched fusion off in the server-argument rules",
        seen=("0.5.13", "0.5.23"),
        files=_ARGS_FILES,
        fix="drop --enable-deterministic-inference, or leave fusion off (sglang_server_allreduce_fusion: off)",
    ),
    LogPattern(
        id="fusion-workspace-initialized",
        expectation=Expectation.FUSION,
        sign=Sign.CONFIRMED,
        regex=r"FlashInfer (?:AllReduce Fusion enabled and )?workspace initialized",
        meaning="the fusion workspace exists: the fused allreduce + RMSNorm path runs",
        seen=("0.5.9", "0.5.23"),
        files=_FUSION_FILE,
    ),
    LogPattern(
        id="symm-mem-capability",
        expectation=Expectation.SYMM_MEM,
        sign=Sign.DEGRADED,
        regex=r"TorchSymmMemCommunicator: Device capability (?P<major>\S+) not supported, communicator is not",
        meaning="SGLang's symmetric-memory size map has no entry for this compute-capability major: it is off",
        seen=("0.5.9", "0.5.23"),
        files=_SYMM_FILE,
        fix=f"{_SCAN} (capability maps); {_PATCH}",
    ),
    LogPattern(
        id="symm-mem-world-size",
        expectation=Expectation.SYMM_MEM,
        sign=Sign.DEGRADED,
        regex=r"TorchSymmMemCommunicator: World size (?P<world_size>\S+) not supported, communicator is not",
        meaning="the size map has no entry for this TP size: the communicator is off",
        seen=("0.5.9", "0.5.23"),
        files=_SYMM_FILE,
        fix=f"{_SCAN} (it lists the world sizes of the map); use a TP size it covers, or sglang_server_symm_mem: off",
    ),
    LogPattern(
        id="symm-mem-multicast",
        expectation=Expectation.SYMM_MEM,
        sign=Sign.DEGRADED,
        regex=r"TorchSymmMemCommunicator: torch symmetric memory multicast operations are not supported",
        meaning="the rendezvous gave no multicast address (PCIe): the communicator turned itself off, two-shot too",
        seen=("0.5.9", "0.5.23"),
        files=_SYMM_FILE,
        fix=f"{_SCAN} (multicast early return); {_PATCH}: the patch keeps two-shot, which needs P2P only",
    ),
    LogPattern(
        id="adaptive-disabled",
        expectation=Expectation.ADAPTIVE,
        sign=Sign.DEGRADED,
        regex=r"speculative_adaptive disabled: (?P<reason>.*)\. Falling back to static speculative params",
        meaning="the server-argument rules found adaptive speculation unsupported: static steps run",
        seen=("0.5.13", "0.5.23"),
        files=("srt/arg_groups/speculative_hook.py",),
        fix="the reason is in the line: adaptive needs --speculative-algorithm EAGLE or EAGLE3, "
        "--speculative-eagle-topk 1, no attention DP, no two-batch overlap, no multi-layer EAGLE; change that, "
        "or drop sglang_server_speculative_adaptive_config",
    ),
    LogPattern(
        id="adaptive-initialized",
        expectation=Expectation.ADAPTIVE,
        sign=Sign.CONFIRMED,
        regex=r"AdaptiveSpeculativeParams initialized: steps=(?P<steps>\S+), candidate_steps=(?P<candidates>.*)",
        meaning="the adaptive step controller was built with these candidates",
        seen=("0.5.13", "0.5.23"),
        files=("srt/speculative/adaptive_spec_params.py",),
    ),
    LogPattern(
        id="speculative-draft-graph",
        expectation=Expectation.SPECULATIVE,
        sign=Sign.CONFIRMED,
        regex=r"Capture draft (?:decode )?(?i:cuda graph) end\.",
        meaning="the draft model's CUDA graphs were captured: the speculative worker is up",
        seen=("0.5.9", "0.5.23"),
        files=("srt/speculative/eagle_worker.py", "srt/speculative/eagle_worker_v2.py"),
    ),
    LogPattern(
        id="cuda-graph-disabled",
        expectation=Expectation.CUDA_GRAPH,
        sign=Sign.DEGRADED,
        regex=r"(?i:cuda graph) is disabled because (?P<reason>.*)",
        meaning="the server-argument rules turned CUDA graphs off: decode runs eagerly (speculation pays far less)",
        seen=("0.5.9", "0.5.23"),
        files=_ARGS_FILES,
        fix="the line names the option that turned graphs off (attention backend, deepep normal mode, "
        "--enable-mis): change it",
    ),
    LogPattern(
        id="cuda-graph-capture-failed",
        expectation=Expectation.CUDA_GRAPH,
        sign=Sign.DEGRADED,
        regex=r"Capture cuda graph failed: (?P<error>.*)",
        meaning="capturing the decode CUDA graphs raised (the server stops)",
        seen=("0.5.9", "0.5.23"),
        files=("srt/model_executor/cuda_graph_runner.py", "srt/model_executor/runner/decode_cuda_graph_runner.py"),
        fix="the traceback above the line says where; lower --cuda-graph-max-bs or --mem-fraction-static, or "
        "launch with --disable-cuda-graph to confirm the rest works",
    ),
    LogPattern(
        id="cuda-graph-captured",
        expectation=Expectation.CUDA_GRAPH,
        sign=Sign.CONFIRMED,
        regex=r"Capture (?:target (?:decode|verify) )?(?i:cuda graph) end\.",
        meaning="the target model's decode (or verify) CUDA graphs were captured",
        seen=("0.5.9", "0.5.23"),
        files=(
            "srt/model_executor/model_runner.py",
            "srt/model_executor/model_runner_components/cuda_graph_setup.py",
        ),
    ),
)


# What a complete startup log means when neither a confirming nor a degrading line appears (and server_info confirms
# nothing either): the workspace or controller was never built. Symmetric memory prints no confirmation, so there the
# absence of its disable lines is the confirmation.
NEVER_RAN: Mapping[Expectation, tuple[str, str]] = {
    Expectation.FUSION: (
        "no FlashInfer workspace was initialized in a complete startup: the fused path never ran (a runtime gate "
        "keeps this GPU or this model out)",
        f"{_SCAN} (fusion gates); {_PATCH}",
    ),
    Expectation.ADAPTIVE: (
        "no 'AdaptiveSpeculativeParams initialized' line in a complete startup: adaptive steps are off",
        "check that --speculative-adaptive-config names a readable JSON file and that SGLang is 0.5.13 or newer",
    ),
}
SILENT_WHEN_ON = "no TorchSymmMemCommunicator line in a complete startup: the communicator kept itself on"
