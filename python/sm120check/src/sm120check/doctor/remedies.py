"""Remedies named once: the playbook tag, variable or command that fixes a family of problems."""

from __future__ import annotations

from sm120check import manifest

PLAYBOOK = "ansible-playbook site.yml"


def tags(tag: str, extra: str = "") -> str:
    return f"{PLAYBOOK} --tags {tag}" + (f" {extra}" if extra else "")


CUDA_TOOLKIT = tags("cuda_toolkit")  # installs the pinned toolkit (cuda_toolkit_version)
CUDA_ENV = tags("cuda_env")  # sitecustomize hook, profile.d, ld.so.conf.d + ldconfig
NCCL = tags("nccl")  # the pinned NCCL wheel and its loader entry
PYTHON_STACK = tags("python_stack")  # the venv's pinned wheels
SM120CHECK = tags("sm120check")  # installs the checker and writes the manifest
PREFLIGHT = tags("preflight")  # checks the OS, Python, driver and GPUs; changes nothing
# The driver is no playbook task: install it, and preflight says whether it is enough.
DRIVER = (
    "install an NVIDIA driver >= the manifest's driver_min with the open kernel modules "
    "(for example `apt install nvidia-open-580`), reboot; the preflight role checks it: " + PREFLIGHT
)
# Every message about a cold FlashInfer JIT cache (flashinfer_jit and allreduce_fusion checks) gives this one.
FLASHINFER_JIT = tags(
    "flashinfer_jit",
    "(builds once per cache key and copies the cache to every node of that key; one node without Ansible: "
    "the stack venv's python -m sm120check.jitcache build)",
)

# Every remedy the doctor prints is a name below (or above), by the family that fixes it; checks use the names,
# never literal text (tests/unit/doctor/test_remedies_table.py fails on an inline `remedy=`).

# preflight: the OS and interpreter the CUDA 13 wheels need (preflight/platform.py)
PYTHON_TOO_OLD = f"set python_stack_python to a Python >= 3.10 interpreter; {PYTHON_STACK}"  # Python < 3.10
GLIBC_TOO_OLD = "use a distribution with glibc >= 2.28 (Debian 12, Ubuntu 22.04/24.04)"  # manylinux_2_28 wheels

# driver: the kernel driver, its device nodes and NVML (preflight/driver.py, cuda_toolkit/nvrtc_launch.py)
# NVML's library and the loaded kernel module differ (or a container without the NVIDIA container toolkit).
DRIVER_LIBRARY_MISMATCH = (
    "a driver/library version mismatch: reboot after a driver upgrade, or in a container start it with "
    "the NVIDIA container toolkit (--gpus / --device nvidia.com/gpu=all) so libnvidia-ml.so.1 is injected"
)
DRIVER_NO_GPU = "check `nvidia-smi`; in a container pass the GPUs (--gpus all)"  # the driver sees no GPU
DRIVER_OPEN_MODULES = "Blackwell GPUs need the open kernel modules: " + DRIVER  # proprietary modules on Blackwell
# The NVML child hung or crashed: a stray pynvml or libnvidia-ml.so.1, or a GPU off the bus.
NVML_HANG = (
    "a pynvml on the path or a libnvidia-ml.so.1 that hangs or crashes on load: find it from the step "
    "above (`python -c 'import pynvml; print(pynvml.__file__)'`, `ldconfig -p | grep nvidia-ml`), remove or "
    "reinstall it; a GPU off the bus (`dmesg | grep -i xid`) needs a reset or a reboot"
)
DEVICE_NODES = "load the driver (`nvidia-modprobe`), or in a container pass the devices (--gpus all)"  # no /dev/nvidia*
UVM_NODE = "`nvidia-modprobe -u -c=0` on the host; in a container add --device /dev/nvidia-uvm"  # no /dev/nvidia-uvm
PERSISTENCE_MODE = "`nvidia-smi -pm 1` (or enable the nvidia-persistenced service)"  # persistence mode off

# cuda_toolkit: nvcc and NVRTC of the pinned release (cuda_toolkit/toolkit.py, cuda_toolkit/nvrtc.py,
# cuda_toolkit/nvrtc_launch.py)
TOOLKIT = f"{CUDA_TOOLKIT}, then {CUDA_ENV} (sets CUDA_HOME / CUDA_PATH / PATH)"  # no working nvcc under CUDA_HOME
TOOLKIT_VERSION = f"{TOOLKIT} (cuda_toolkit_version)"  # nvcc is not the manifest's release
HOST_COMPILER = f"apt install g++ ({CUDA_TOOLKIT} installs it)"  # nvcc found no host compiler
NVRTC_NO_SM120 = f"{CUDA_TOOLKIT} (cuda_toolkit_version)"  # this NVRTC does not list sm_120
NVRTC_NO_SM120F = f"{CUDA_TOOLKIT} (cuda_toolkit_version: an NVRTC >= 12.9 that knows sm_120f)"  # a compile failed
NVRTC_LAUNCH_PROBE = (
    "run `python -m sm120check.doctor.cuda_toolkit.nvrtc_launch_probe` by hand to see the error"  # probe died
)


# cuda_env: CUDA_HOME, the loader entries and the venv's start-up hook (cuda_toolkit/toolkit.py, nvrtc.py, env.py, ...)
def cuda_home(want_home: str) -> str:
    """CUDA_HOME resolves elsewhere than the manifest's `cuda.home`."""
    return f"{CUDA_ENV} (exports CUDA_HOME={want_home}) and start a new shell"


NVRTC_LOADER = f"{CUDA_ENV} (writes the ld.so.conf.d entry for the NVRTC lib dir and runs ldconfig)"  # wrong NVRTC
# NVRTC's compiler builtins library is not on the loader path (NVRTC_ERROR_BUILTIN_OPERATION_FAILURE).
NVRTC_BUILTINS = (
    "NVRTC could not open libnvrtc-builtins.so.13.0: its directory must be on the loader path; "
    + CUDA_ENV
    + " (ld.so.conf.d entry + ldconfig)"
)


def nvrtc_compile(code: int) -> str:
    """An NVRTC compile for sm_120 / 120a / 120f failed with nvrtcResult `code`."""
    return NVRTC_BUILTINS if code == 7 else NVRTC_NO_SM120F  # 7: NVRTC_ERROR_BUILTIN_OPERATION_FAILURE


def nvrtc_hang(soname: str) -> str:
    """Loading the NVRTC the loader finds hung or crashed the probe."""
    return (
        f"the {soname} the loader finds (LD_LIBRARY_PATH, `ldconfig -p | grep nvrtc`) hangs or "
        f"crashes when loaded: remove it from the loader path, then {NVRTC_LOADER}"
    )


def env_hook(module: str) -> str:
    """The venv's start-up hook (`module`.py + .pth) is missing or sets other values than the manifest's env."""
    return f"{CUDA_ENV} (writes {module}.py and {module}.pth into the venv's site-packages)"


ENV_DEAD_FILE = f"delete the dead file; the .pth hook does its job ({CUDA_ENV})"  # a shadowed sitecustomize.py

# python_stack: the stack venv's pinned wheels (python_stack/torch.py, abi.py, stack.py, env.py, flashinfer_jit.py)
TORCH = f"{PYTHON_STACK} (sm120kit_profiles: torch pinned to a CUDA 13 build, >= 2.11)"  # torch is not a CUDA 13 build
FULL_PROFILE = f"the full profile installs it: {PYTHON_STACK} -e sm120kit_profile=full"  # torch / SGLang absent
STACK_PINS = f"{PYTHON_STACK} (sm120kit_profiles / sm120kit_extra_python_packages)"  # venv differs from the pins
STACK_VENV = f"{PYTHON_STACK} (sm120kit_venv)"  # the venv's interpreter is missing
ABI_MIXED_LIBS = f"{PYTHON_STACK} and {CUDA_ENV}"  # a torch process maps CUDA 12 or two copies of a library
ABI_FOREIGN_LIBS = f"{CUDA_ENV} (ld.so.conf.d entry + ldconfig) and {NCCL}"  # libraries other than the manifest's


def torch_toolkit(cuda: str) -> str:
    """torch is built for CUDA `cuda`, the toolkit under CUDA_HOME is another release."""
    return f"{CUDA_TOOLKIT} and {CUDA_ENV} (CUDA_HOME to a {cuda} toolkit)"


def cuda12_wheels(venv: str, names: str) -> str:
    """CUDA 12 wheels `names` (space-separated; "" for a CUDA 12 torch alone) in the CUDA 13 stack venv `venv`."""
    return (f"{venv}/bin/pip uninstall -y {names}; then " if names else "") + PYTHON_STACK


# sm120check: the checker and the node manifest it writes (preflight/platform.py, python_stack/stack.py)
MANIFEST_MISSING = f"{SM120CHECK} (writes {manifest.DEFAULT_PATH}), or pass --manifest PATH"  # none or unusable
MANIFEST_STALE = f"{SM120CHECK} to install the matching checker and rewrite the manifest"  # another sm120kit wrote it
NO_MANIFEST = f"{SM120CHECK}, or pass --manifest PATH"  # a comparison that needs the manifest

# sglang_sm120: SGLang's SM120 patch and what a server started now would choose (sglang_sm120/sglang.py, sglang_comm.py)
SGLANG_PATCH = "sm120check sglang patch (role sglang_sm120, tag sglang_sm120_configure); undo with --revert"
SGLANG_PATCH_RERUN = "sm120check sglang patch (role sglang_sm120, tag sglang_sm120_configure), then rerun the doctor"
# The SGLang communication probe's answer could not be read.
SGLANG_PROBE_MALFORMED = (
    "report it to the sm120kit maintainers with the probe's output "
    "(python -m sm120check.doctor.sglang_sm120.sglang_comm_probe)"
)
# SGLang's workspace preflight could not allocate.
GPU_MEMORY = "free GPU memory before the server starts (nvidia-smi shows who holds it), or lower --mem-fraction-static"
SEE_DETAILS = "see the details"  # SGLang turned fusion off for a reason the details quote
SGLANG_FUSION_WRONG = "report to SGLang/FlashInfer with this output"  # fused allreduce differs from the reference
SGLANG_SYMM_MEM_WRONG = "report to SGLang; serve without --enable-torch-symm-mem"  # symmetric memory all_reduce wrong
# SGLang's PcieIpcCommunicator (0.5.22+) summed wrong, or did not build: the launch role must leave it off
SGLANG_PCIE_IPC_WRONG = (
    "leave sglang_server_pcie_ipc_allreduce at auto or off (the role keeps PCIe-IPC off on this verdict); report to "
    "SGLang/FlashInfer with this output"
)
SGLANG_PCIE_IPC_OFF = (
    "PCIe-IPC all-reduce stays off on this node (role sglang_server decides it from this verdict); the line from "
    "SGLang above says why: a FlashInfer without pcie_ipc_comm needs the stack's FlashInfer pin (full profile)"
)


# node health (node_health/health.py, node_health/verdicts.py): hardware, so no role fixes it; the step a person takes.
def all_of(*parts: str) -> str:
    """Several remedies as one (each once, in order): a node verdict over GPUs, the Xids' next steps."""
    return "; ".join(dict.fromkeys(p for p in parts if p))


PCIE_SLOT = (
    "reseat the GPU or move it to a CPU-attached x16 slot (not a chipset or bifurcated x8 slot, no riser); set the "
    "slot's link speed to Auto/Gen5 in the BIOS; check `sudo lspci -vv -s <bus> | grep -E 'LnkCap|LnkSta'`"
)
PCIE_SLOT_GEN = (
    "a CPU-attached slot of the GPU's own generation doubles host bandwidth; check the slot's BIOS link speed"
)
PCIE_REPLAY = "replays are link-level retransmissions (bit errors): " + PCIE_SLOT
COPY_BANDWIDTH = (
    "check the pcie_link verdict (a link trained below its maximum), then IOMMU mode (`iommu=pt`) and the slot: "
    + PCIE_SLOT
)
GPU_OFF_BUS = (
    "the GPU stopped answering on PCIe: drain the node, check its power cables and seating, reboot; if it repeats, "
    "report it to NVIDIA / RMA (Xid 79)"
)
KERNEL_LOG_ROOT = "run the doctor as root (or give it CAP_SYSLOG) to read the kernel log"
ECC_ROW_REMAP_FAILED = (
    "drain the GPU and RMA it (NVIDIA's row-remapping RMA policy); it cannot hide further memory faults"
)
ECC_UNCORRECTED = (
    "restart the applications on it, then reset the GPU (`sudo nvidia-smi -r -i N`) or reboot; RMA if they come back"
)
ECC_PENDING = "drain the GPU, then `sudo nvidia-smi -r -i N` or reboot"
ECC_LIFETIME = "watch it: run `dcgmi diag -r 3`; RMA if the count grows"
CLOCKS_HW_SLOWDOWN = (
    "HW slowdown / power brake: check PSU capacity and the GPU's power cables (all connectors seated); "
    "thermal: check airflow, fans and the chassis temperature (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE`)"
)
COOLING = "improve cooling / airflow (`nvidia-smi -q -d TEMPERATURE,PERFORMANCE`)"
COMPUTE_LOAD = (
    "the compute load needs NVRTC (libnvrtc.so.13: " + CUDA_TOOLKIT + ", or the nvidia-cuda-nvrtc wheel in the "
    "doctor's venv) and a driver that JIT-compiles its PTX"
)
RESIZABLE_BAR = "enable 'Above 4G decoding' and 'Resizable BAR' in the BIOS (P2P on RTX parts maps through BAR1)"
MIXED_PRODUCTS = "serve with GPUs of one edition (CUDA_VISIBLE_DEVICES)"
TUNED_CONFIGS = (
    "SGLang falls back to default (untuned) MoE / FP8 GEMM configs: tune them for this edition "
    "(sglang benchmark/kernels/fused_moe_triton tuning script) or copy a sibling edition's files under this name"
)


def power_limit(index: int, watts: int) -> str:
    return f"raise it: `sudo nvidia-smi -i {index} -pl {watts}` (persists until reboot)"


def mig_off(index: int) -> str:
    return f"`sudo nvidia-smi -i {index} -mig 0`, then reset the GPU or reboot"


def gpu_process(index: int, pid: int) -> str:
    return (
        f"stop it (`nvidia-smi --query-compute-apps=pid,used_memory --format=csv -i {index}`, then end pid {pid}) "
        "or leave room for it in --mem-fraction-static"
    )


# the runner and the shared stack-venv guard (runner.py, stackenv.py): what any check may end with
RERUN_DOCTOR = "run the doctor again and let it finish"  # interrupted by a signal
CHECK_RAISED = "report this traceback to the sm120kit maintainers (and `--skip` the check meanwhile)"
STACK_VENV_MISSING = f"{PYTHON_STACK} (sm120kit_venv), or fix `venv` in the manifest"  # the manifest's venv is gone


def unskip(required: str) -> str:  # a prerequisite left out with --skip
    return f"run without `--skip {required}` (or add `--select {required}`)"


# multi-GPU communication (comm/collectives.py): the node's GPUs together, so no one role owns it
# PCIe P2P hangs or is refused: the IOMMU translates peer DMA, or ACS sends it up to the root complex.
COMM_P2P = (
    "PCIe P2P is blocked: confirm by rerunning with NCCL_P2P_DISABLE=1 (slower, but it completes); fix by booting "
    "with iommu=pt (GRUB_CMDLINE_LINUX, or turn the IOMMU/VT-d off in firmware) and disabling ACS on the PCIe "
    "switch ports (firmware setting, or `setpci -s <port> ECAP_ACS+6.w=0000`), then reboot"
)
COMM_TOPOLOGY_PROBE = "check `nvidia-smi topo -m` by hand"  # the topology probe died
COMM_GEFORCE = "use RTX PRO / data-center GPUs for P2P; on GeForce keep NCCL's default (shared memory) transport"
COMM_TWO_GPUS = "run on a multi-GPU node"  # fewer than two GPUs selected
COMM_GPU_INDICES = "pass indices it lists"  # --gpus names a GPU the driver does not see


def comm_select(check: str) -> str:
    """A prerequisite of a communication check was not selected."""
    return f"add `--select {check}`"


def comm_malformed(module: str) -> str:
    """A communication probe (the child module `module`) printed an answer that does not fit its payload type."""
    return f"report it to the sm120kit maintainers with the probe's output (python -m {module})"


def nccl_upgrade(version: str) -> str:
    """NCCL returned wrong sums or faulted at a message size (NVIDIA/nccl#2418 and kin); the floor from the one
    NCCL table (nccl_floor.py)."""
    from sm120check.doctor import nccl_floor

    confirmed = ".".join(map(str, nccl_floor.CONFIRMED_GOOD))
    return (
        f"upgrade NCCL from {version or 'this release'} to >= {nccl_floor.floor()} (NVIDIA/nccl#2418: 2.26.2 "
        f"faults at 512 KiB and more on dual RTX PRO 6000; {confirmed} is confirmed good): set "
        f"sm120kit_nccl_version, then {NCCL}"
    )


# Bus bandwidth at 64 MiB under the PCIe floor: a narrow or slow link, or P2P off (traffic through host memory).
COMM_PCIE_BUSBW = (
    "check each GPU's PCIe link (`nvidia-smi -q -d PCI`: Gen and width against the slot's; the node_health check "
    "reads it), that P2P is on (`nvidia-smi topo -p2p r`; the topology check), and `NCCL_DEBUG=INFO` for the "
    "transport NCCL chose (P2P/IPC, not SHM)"
)
COMM_SYMM_MEM = "needs torch >= 2.6 with CUDA P2P between the GPUs; " + COMM_P2P  # symmetric memory failed
COMM_SYMM_MEM_WRONG = "report to PyTorch with this output; serve with NCCL meanwhile"
COMM_NO_FLASHINFER = f"{PYTHON_STACK} installs flashinfer-python"
COMM_FUSION_PROBE = f"warm FlashInfer's JIT cache first: {FLASHINFER_JIT}"  # the fusion probe died
COMM_FUSION_ARCH = "set FLASHINFER_CUDA_ARCH_LIST to the GPUs' targets (e.g. 12.0f)"  # FlashInfer refused the arch
COMM_FUSION_JIT_TIMEOUT = f"warm FlashInfer's JIT cache: {FLASHINFER_JIT}; or raise SM120CHECK_JIT_TIMEOUT"
COMM_FUSION_FAILED = "see the details; serve without allreduce fusion meanwhile"
COMM_FUSION_WRONG = "report to FlashInfer with this output; serve unfused"
COMM_FUSION_COLD = f"warm FlashInfer's JIT cache at provisioning, so servers start without compiling: {FLASHINFER_JIT}"


# peer copies between GPUs (comm/peer.py, node_health/verdicts.py): the links and P2P of the node's GPUs together
PEER_BANDWIDTH = (
    "check both GPUs' `pcie_link` and `gpu_copy_bandwidth` verdicts (a link trained below its maximum), then the "
    "`topology` check: IOMMU translation (boot with iommu=pt) or ACS redirection on the switch ports sends peer "
    "traffic up to the root complex"
)
PEER_NO_P2P = (
    "the `topology` check says why P2P is off between these GPUs (a GeForce driver, IOMMU translation, ACS "
    "redirection, GPUs on different CPU sockets) and what fixes it"
)
PEER_TIMEOUT = "raise --timeout: a pair takes about half a second, and N GPUs make N x (N - 1) ordered pairs"


def peer_probe(gpus: str) -> str:
    """The peer-copy probe failed or died: run it by hand for the failing CUDA call."""
    return (
        f"run `python -m sm120check.doctor.comm.peer_bandwidth_probe --gpus {gpus}` by hand for the failing step or "
        "CUDA call; check `gpu_xid` for Xids logged meanwhile"
    )


# pcie_p2p: the node's PCIe fabric for GPU peer-to-peer (pcie_p2p/fabric.py): the IOMMU mode and ACS on the bridges
PCIE_P2P = tags("pcie_p2p")  # the role: kernel parameters for P2P, ACS cleared on the GPUs' bridges
IOMMU_PASSTHROUGH = (
    f"{PCIE_P2P} (puts iommu=pt on the kernel command line and asks for a reboot), then reboot; by hand: add "
    "iommu=pt (AMD: or amd_iommu=off; Intel: or intel_iommu=off) to GRUB_CMDLINE_LINUX in /etc/default/grub, "
    "`update-grub`, reboot, or turn the IOMMU / VT-d off in the firmware"
)
ACS_REDIRECT = (
    f"{PCIE_P2P} (clears ACS redirection on the bridges above the GPUs); by hand, until the next boot: "
    "`sudo setpci -s <bdf> ECAP_ACS+6.w=0000` on each bridge named; for good: boot with pci=noacs or turn ACS off "
    "in the BIOS (NVIDIA/nccl#2079)"
)
PCIE_REBOOT = "reboot the node: the pcie_p2p role changed the kernel command line, which takes effect at the next boot"
PCIE_FACT_FILE = f"{PCIE_P2P} rewrites /var/lib/sm120kit/pcie-p2p.json"  # the fact file is not schema 1
LSPCI_MISSING = "apt install pciutils (lspci), then run the doctor again"
LSPCI_ROOT = "run the doctor as root: lspci shows the ACS control registers to root only"


# GPU pairs over PCIe at level 3 (comm/peer.py, comm/pairs.py): writes against reads, many-to-one writes, and a
# two-rank NCCL all-reduce per pair with P2P on and off
# Writes far below reads: the fabric drops posted writes (rtx6kpro hardware/collapse-report.md); no setting fixes it.
PEER_WRITE_COLLAPSE = (
    "no kernel or driver setting fixes a posted-write collapse (the rtx6kpro collapse report: not iommu=off/pt, not "
    "ACS, not the kernel or driver); keep each tensor-parallel group behind one root port / PCIe switch "
    "(CUDA_VISIBLE_DEVICES order), move the GPUs behind one switch or a hierarchical switch fabric, and report the "
    "numbers with `lspci -tv` to the switch or board vendor"
)
# A source writing to one target far below its share while every other GPU writes to that target too.
PEER_STRESS = (
    "the starved source's path to the target is shared or degraded under load: compare with its `pcie_link` and "
    "`gpu_peer_bandwidth` verdicts, then " + PEER_WRITE_COLLAPSE
)
PEER_STRESS_TIMEOUT = "raise --timeout: each target takes about a second, plus a solo write per ordered pair"


def peer_stress_probe(gpus: str) -> str:
    """The many-to-one write probe failed or died: run it by hand for the failing CUDA call."""
    return (
        f"run `python -m sm120check.doctor.comm.peer_stress_probe --gpus {gpus}` by hand for the failing step or CUDA "
        "call; check `gpu_xid` for Xids logged meanwhile"
    )


# NCCL hangs or fails with P2P and completes with NCCL_P2P_DISABLE=1: the IOMMU or ACS blocks peer traffic.
NCCL_PAIR_P2P_BLOCKED = (
    f"PCIe P2P is blocked by the IOMMU or ACS: {PCIE_P2P} (iommu=pt on the kernel command line, ACS redirect "
    "cleared on the bridges above the GPUs at every boot), then reboot; the `iommu` and `pcie_acs` checks say "
    "which is set; docs/pcie.md says what each change risks. Meanwhile serve with NCCL_P2P_DISABLE=1 "
    "(slower) and --disable-custom-all-reduce"
)
# NCCL hangs or fails both with and without P2P between two GPUs: not a P2P setting.
NCCL_PAIR_BROKEN = (
    "not a P2P setting (NCCL fails without P2P too): check `gpu_xid` for Xids, `nccl_allreduce` for the NCCL "
    "release, and rerun the pair by hand with NCCL_DEBUG=INFO: `python -m sm120check.doctor.pcie_p2p.nccl_pair_probe "
    "--gpus A,B`"
)
# NCCL completes with P2P but not with NCCL_P2P_DISABLE=1: the fallback transport (shared memory) is broken.
NCCL_PAIR_NO_FALLBACK = (
    "NCCL's shared-memory transport failed: in a container give it --ipc=host or a larger --shm-size; check "
    "`df -h /dev/shm`; NCCL_DEBUG=INFO names the transport"
)
NCCL_PAIRS_BUDGET = "select fewer GPUs (--gpus) or raise --timeout: each pair runs twice, up to the pair limit each"

# --- the soak (sm120check soak): what to do after a finding under serving load ---
SOAK_SERVER_DIED = (
    "read the server's log around the time named (an engine crash, an OOM kill, a CUDA error), and `sm120check "
    "doctor` for Xids before restarting it"
)
SOAK_SERVER_STALLED = (
    "the server took requests and sent no token: dump its threads (`py-spy dump --pid PID`), read its log, and look "
    "for an Xid; lower --max-running-requests if it recurs at this concurrency only"
)
SOAK_THROUGHPUT = (
    "tokens/s fell and stayed down: look at the clocks, power and temperature plotted beside it (throttling) and "
    "at the server's log (evictions, retractions); soak again at a lower concurrency to see where it holds"
)
SOAK_CLOCKS_BELOW_BASE = "the SM clock fell below its base clock under load: " + CLOCKS_HW_SLOWDOWN
SOAK_SAMPLER_HUNG = (
    "NVML stopped answering under load (a wedged GPU or driver): look for Xid 119/154/79 in the kernel log "
    "(`sm120check doctor`), drain the node and reboot it"
)
SOAK_NVML = "install the NVIDIA driver (libnvidia-ml.so.1) or run where the GPUs are visible; " + DRIVER_NO_GPU
