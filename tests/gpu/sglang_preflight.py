"""SGLang's own FlashInfer workspace preflight on a real GPU without multicast: skips fusion unpatched, passes patched.

Run from the repository root on a GPU machine with SGLang and FlashInfer importable (scripts/device/sglang-carry.sh
and flashinfer-carry.sh, installed into a --target directory on PYTHONPATH) and torch with CUDA:

    python3 tests/gpu/sglang_preflight.py [--cc 9.0] [--gpus 0] [--timeout 240]

1. The driver's own answer: CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED and cuMulticastGetGranularity (a query; no
   multicast object is ever created).
2. Unpatched: the doctor's probe (`sm120check.doctor.sglang_sm120.sglang_comm_probe`) runs SGLang's
   `_flashinfer_trtllm_workspace_allocation_sizes` (expected to raise without multicast) and
   `_preflight_check_workspace_memory` (expected False, with SGLang's "Skipping allreduce fusion." line).
3. `sm120check sglang patch --source <site>/sglang --cc 9.0` (SM90 resolves to the TRT-LLM backend, as SM120 does).
4. Patched: the sizes come back and SGLang's cuMemCreate probe allocates them (preflight True, no skip line).
5. `--revert`: SGLang byte-identical to before.
With two GPUs or more the probe also runs SGLang's TorchSymmMemCommunicator and fused allreduce + RMSNorm.
Prints one line per phase, writes $OUT/sglang_preflight.json when $OUT is set, exits 0 only if all holds.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SRC = Path(os.environ.get("SM120CHECK_SRC") or REPO / "python" / "sm120check" / "src")  # a snapshot may be carried
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def driver_multicast(device: int) -> dict[str, Any]:
    import cuda.bindings.driver as cu

    cu.cuInit(0)
    _, dev = cu.cuDeviceGet(device)
    _, supported = cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, dev)
    prop = cu.CUmulticastObjectProp()
    prop.numDevices = 1
    prop.size = 2 << 20
    prop.handleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    mc_err, granularity = cu.cuMulticastGetGranularity(
        prop, cu.CUmulticastGranularity_flags.CU_MULTICAST_GRANULARITY_RECOMMENDED
    )
    return {"multicast_supported": int(supported), "cuMulticastGetGranularity": str(mc_err), "granularity": granularity}


def tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.py"))}


def sm120check_sglang(*argv: str) -> tuple[int, dict[str, Any]]:
    sys.path.insert(0, str(SRC))
    from sm120check.sglang import cli

    parser = argparse.ArgumentParser(prog="sm120check")
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["sglang", *argv, "--json"])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = args.handler(args)
    return status, json.loads(buf.getvalue())


def probe(gpus: str, timeout: float) -> dict[str, Any]:
    env = {**os.environ, **SAFE_ENV, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        "-m",
        "sm120check.doctor.sglang_sm120.sglang_comm_probe",
        "--gpus",
        gpus,
        "--timeout",
        str(timeout),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout + 30, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"ok": False, "problem": f"probe exit {proc.returncode}", "stderr": proc.stderr[-3000:]}
    data: dict[str, Any] = json.loads(lines[-1])
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cc", default="9.0", help="compute capability to patch for (the H200 is 9.0)")
    parser.add_argument("--gpus", default="0")
    parser.add_argument("--timeout", type=float, default=240.0)
    opts = parser.parse_args()
    os.environ.update(SAFE_ENV)
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.origin:
        print("SGLang is not importable: install it (scripts/device/sglang-carry.sh), set PYTHONPATH", file=sys.stderr)
        return 2
    source = Path(spec.origin).parent
    report: dict[str, Any] = {"sglang": str(source), "env": SAFE_ENV, "cc": opts.cc, "gpus": opts.gpus}
    report["driver"] = driver_multicast(int(opts.gpus.split(",")[0]))
    print("driver:", json.dumps(report["driver"]))
    before = tree_hashes(source)
    unpatched = probe(opts.gpus, opts.timeout)
    status, patched_info = sm120check_sglang("patch", "--source", str(source), "--cc", opts.cc)
    files = [str(f["path"]) for f in patched_info.get("files") or []]
    report["patch"] = {"status": status, "files": files, "error": patched_info.get("error")}
    patched = probe(opts.gpus, opts.timeout) if status == 0 else {}
    revert_status, _ = sm120check_sglang("patch", "--revert", "--source", str(source))
    identical = tree_hashes(source) == before and not (source / ".sm120kit").exists()
    report.update(unpatched=unpatched, patched=patched, revert_status=revert_status, revert_identical=identical)

    def ranks(data: dict[str, Any]) -> list[dict[str, Any]]:
        return [r for r in data.get("ranks", []) if isinstance(r, dict)]

    def pre(r: dict[str, Any]) -> dict[str, Any]:
        value = r.get("preflight")
        return value if isinstance(value, dict) else {}

    for phase, data in (("unpatched", unpatched), ("patched", patched)):
        for r in ranks(data):
            p = pre(r)
            print(
                f"{phase} rank {r['rank']} ({r.get('name')}, SGLang {r.get('sglang')}): preflight "
                f"{'PROCEED' if p.get('ok') else 'SKIP'}; sizes {p.get('sizes') or p.get('sizes_error')}; "
                f"log {p.get('log')}"
            )
            for part in ("symm_mem", "fusion"):
                if part in r:
                    print(f"  {part}: {json.dumps(r[part])[:600]}")
        if not data.get("ok"):
            evidence = str(data.get("evidence") or data.get("stderr"))[-1500:]
            print(f"{phase}: probe problem {data.get('problem')} {evidence}")
    skip_line = "Skipping allreduce fusion."
    ok_unpatched = bool(ranks(unpatched)) and all(
        not pre(r).get("ok")
        and "cuMulticastGetGranularity" in str(pre(r).get("sizes_error"))
        and any(skip_line in str(line) for line in pre(r).get("log", []))
        for r in ranks(unpatched)
    )
    ok_patched = bool(ranks(patched)) and all(
        pre(r).get("ok") is True
        and pre(r).get("sizes")
        and not any(skip_line in str(line) for line in pre(r).get("log", []))
        for r in ranks(patched)
    )
    print(f"patch: exit {status}, {len(files)} files; revert: exit {revert_status}, byte-identical {identical}")
    verdict = ok_unpatched and ok_patched and revert_status == 0 and identical
    report["verdict"] = {"unpatched_skips": ok_unpatched, "patched_proceeds": ok_patched, "pass": verdict}
    print("PASS" if verdict else "FAIL", json.dumps(report["verdict"]))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "sglang_preflight.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
