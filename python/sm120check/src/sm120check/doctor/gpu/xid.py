"""The Xid catalogue: what an Xid means, how bad it is for serving, and what to do next.

Names and NVIDIA's recommended actions: NVIDIA's Xid listing and catalog,
https://docs.nvidia.com/deploy/xid-errors/index.html and
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (listing r555, as mirrored in
leptonai/gpud components/accelerator/nvidia/query/xid/xid.go). Where NVIDIA's listing gives no action, the step
here is ours and says so ("sm120kit:"). Severity "fail" = the set Azure/azurehpc-health-checks treats as a node
fault (customTests/azure_gpu_xid.nhc: 48 56 57 58 62 63 64 65 68 69 73 74 79 80 81 92 119 120) plus 95 and 140
(uncontained / unrecovered ECC) and 154 (the driver asks for a GPU reset or a reboot); "warn" = usually an
application fault or a follow-on message.
An Xid not listed here is reported as "not in the catalogue" with the URL, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

URL = "https://docs.nvidia.com/deploy/xid-errors/index.html"

AZUREHPC_XIDS = frozenset({48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120})

_RESET_OURS = (
    "sm120kit: drain the GPU, reset it (`sudo nvidia-smi -r -i <gpu>`) or reboot; if it repeats, run field "
    "diagnostics (`dcgmi diag -r 3`) and report it to NVIDIA / RMA"
)


@dataclass(frozen=True)
class XidInfo:
    xid: int
    name: str  # NVIDIA's name for it
    severity: str  # "fail" or "warn"
    action: str  # the next step


CATALOGUE: dict[int, XidInfo] = {
    x.xid: x
    for x in (
        XidInfo(
            13,
            "Graphics Engine Exception",
            "warn",
            "NVIDIA: run DCGM and field diagnostics to confirm whether it is hardware; if not, debug the user "
            "application (typically an out-of-range address or illegal instruction in a kernel)",
        ),
        XidInfo(
            31,
            "GPU memory page fault",
            "warn",
            "NVIDIA: debug the user application (an illegal address), unless it is new after a driver or system "
            "software change with the application unchanged: then report a GPU issue",
        ),
        XidInfo(
            43,
            "GPU stopped processing",
            "warn",
            "sm120kit: a user application fault stopped that application's work (NVIDIA lists it as a possible "
            "user application error); restart the application, the GPU keeps serving others",
        ),
        XidInfo(
            45,
            "Preemptive cleanup, due to previous errors",
            "warn",
            "NVIDIA: no action, informative only: channels affected by another failure were removed; look at the "
            "Xid logged just before it",
        ),
        XidInfo(
            48,
            "Double Bit ECC Error",
            "fail",
            "NVIDIA: if followed by Xid 63 or 64, drain the node, let work finish and reset the GPU; otherwise run "
            "field diagnostics; RMA on excessive errors",
        ),
        XidInfo(56, "Display Engine error", "fail", _RESET_OURS),
        XidInfo(57, "Error programming video memory interface", "fail", _RESET_OURS),
        XidInfo(58, "Unstable video memory interface detected (or EDC error)", "fail", _RESET_OURS),
        XidInfo(
            62,
            "Internal micro-controller halt",
            "fail",
            "NVIDIA: PMU halt error: report a GPU issue and reset the GPU",
        ),
        XidInfo(
            63,
            "ECC page retirement or row remapping recording event",
            "fail",
            "NVIDIA: a row remap (page retirement on older GPUs) was recorded; with Xid 94 restart the application "
            "that hit it, and reset the GPU or reboot when convenient so the remap takes effect; with Xid 48 drain "
            "and reset now",
        ),
        XidInfo(
            64,
            "ECC page retirement or row remapper recording failure",
            "fail",
            "NVIDIA: the remap could not be recorded: reset the GPU / reboot now; if it continues, drain, triage "
            "and report a GPU issue (RMA)",
        ),
        XidInfo(65, "Video processor exception", "fail", _RESET_OURS),
        XidInfo(68, "NVDEC0 Exception", "fail", _RESET_OURS),
        XidInfo(69, "Graphics Engine class error", "fail", _RESET_OURS),
        XidInfo(73, "NVENC2 Error", "fail", _RESET_OURS),
        XidInfo(
            74,
            "NVLINK Error",
            "fail",
            "NVIDIA: decode the first hex word of the message: ECC/parity bits (4, 5) repeated on a link: report "
            "it; signal-integrity bits (21, 22): check and reseat the link's mechanical connections; run diags",
        ),
        XidInfo(
            79,
            "GPU has fallen off the bus",
            "fail",
            "NVIDIA: drain and report a GPU issue. sm120kit: the GPU stopped answering on PCIe: check its power "
            "cables and PSU headroom, reseat it, avoid risers and chipset-attached slots, check the slot's BIOS "
            "link-speed setting; a reboot is needed to get it back",
        ),
        XidInfo(80, "Corrupted data sent to GPU", "fail", _RESET_OURS),
        XidInfo(81, "VGA Subsystem Error", "fail", _RESET_OURS),
        XidInfo(
            92,
            "High single-bit ECC error rate",
            "fail",
            "NVIDIA: run field diagnostics to collect debug information; RMA on excessive errors",
        ),
        XidInfo(
            94,
            "Contained ECC error",
            "warn",
            "NVIDIA: restart the application that hit the error; others keep running until a convenient GPU reset "
            "or reboot activates the row remap",
        ),
        XidInfo(
            95,
            "Uncontained ECC error",
            "fail",
            "NVIDIA: without MIG, reboot the node now; with MIG, drain the other instances and reset the GPU; if it "
            "continues, drain, triage and report a GPU issue",
        ),
        XidInfo(
            109,
            "Context Switch Timeout Error",
            "warn",
            "sm120kit: NVIDIA lists hardware, driver, application, bus and thermal causes; restart the application, "
            "and if it repeats without an application change, reset the GPU and run diagnostics",
        ),
        XidInfo(119, "GSP RPC Timeout", "fail", _RESET_OURS),
        XidInfo(120, "GSP Error", "fail", _RESET_OURS),
        XidInfo(140, "Unrecovered ECC Error", "fail", _RESET_OURS),
        XidInfo(
            154,
            "GPU Recovery Action Changed",
            "fail",
            "NVIDIA: do the recovery action the line names (GPU Reset Required: drain and reset the GPU; Node Reboot "
            "Required: drain and reboot). sm120kit: on RTX parts where `nvidia-smi -r` is unsupported, reboot",
        ),
    )
}


def lookup(xid: int) -> XidInfo:
    """The catalogue entry; an unknown Xid is a warn that points at NVIDIA's catalogue instead of a guess."""
    found = CATALOGUE.get(xid)
    if found is not None:
        return found
    severity = "fail" if xid in AZUREHPC_XIDS else "warn"
    return XidInfo(xid, "not in the catalogue", severity, f"look up Xid {xid} in NVIDIA's catalogue: {URL}")
