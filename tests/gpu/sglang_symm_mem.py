"""SGLang's own TorchSymmMemCommunicator on 2 GPUs without multicast: off unpatched, on and exact once patched.

Run from the repository root on a machine with 2 GPUs, SGLang installed (for example from the wheels of
scripts/device/sglang-carry.sh into a --target directory on PYTHONPATH) and torch with CUDA:

    python3 tests/gpu/sglang_symm_mem.py [--cc 9.0] [--timeout 240]

1. Unpatched: two ranks (torch.multiprocessing, no torchrun) build the communicator; it must disable itself
   (the multicast early return: multicast is off on these machines, as on every PCIe box).
2. `sm120check sglang patch --source <site>/sglang --cc 9.0` (in-process).
3. Patched: the communicator must be enabled on both ranks, and its all_reduce must equal NCCL's for every size.
4. `--revert` puts SGLang back byte for byte.
Prints one line per phase and rank, writes $OUT/sglang_symm_mem.json when $OUT is set, exits 0 only if all holds.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import logging
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# SGLang 0.5.23 sizes the communicator's buffer for its Inkling custom allreduce (default on) from the server's
# published config, which a bare process group lacks ("config namespace 'exec' not published"). Turning it off
# only keeps the buffer at the capability map's size; the multicast early return, the subject of this test, is
# reached exactly as in a server.
SGLANG_ENV = {"SGLANG_OPT_USE_INKLING_CUSTOM_AR": "false"}
SIZES = (7168, 64 * 7168, 4 * 1024 * 1024)  # bf16 elements: one decode token, a small batch, 8 MiB
WORLD = 2
TOLERANCE = 0.0625  # two bf16 ulps at the largest sums of N(0, 1) pairs; two-shot and NCCL usually agree exactly
COMM_MODULE = "sglang.srt.distributed.device_communicators.torch_symm_mem"


def _rank(rank: int, port: int, results: str) -> None:
    """One rank: build SGLang's communicator on the world group, compare its all_reduce with NCCL's."""
    import torch
    import torch.distributed as dist

    record: dict[str, Any] = {"rank": rank}
    messages: list[str] = []

    class Capture(logging.Handler):
        def emit(self, rec: logging.LogRecord) -> None:
            messages.append(rec.getMessage())

    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
        started = time.monotonic()
        module = __import__(COMM_MODULE, fromlist=["TorchSymmMemCommunicator"])
        logging.getLogger(COMM_MODULE).addHandler(Capture())
        record["import_s"] = round(time.monotonic() - started, 2)
        comm = module.TorchSymmMemCommunicator(dist.group.WORLD, rank)
        record.update(disabled=bool(comm.disabled), capability=torch.cuda.get_device_capability(rank)[0])
        record["multimem_selected"] = WORLD in comm._WORLD_SIZES_MULTIMEM.get(record["capability"], ())
        checks = []
        if not comm.disabled:
            gen = torch.Generator(device="cuda").manual_seed(1234 + rank)
            for n in SIZES:
                x = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen)
                ref = x.clone()
                dist.all_reduce(ref)
                out = comm.all_reduce(x)
                torch.cuda.synchronize()
                if out is None:
                    checks.append({"elements": n, "ran": False})
                    continue
                diff = (out.float() - ref.float()).abs().max().item()
                equal = bool(torch.equal(out, ref))
                checks.append(
                    {"elements": n, "ran": True, "max_abs_diff": diff, "equal": equal, "ok": diff <= TOLERANCE}
                )
        record["checks"] = checks
        dist.barrier()
        dist.destroy_process_group()
    except Exception as exc:  # reported, not raised: the parent decides
        record["error"] = f"{type(exc).__name__}: {exc}"
    record["log"] = messages
    Path(results, f"rank{rank}.json").write_text(json.dumps(record), encoding="utf-8")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_phase(timeout: float) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="sglang-symm-") as results:
        port = _free_port()
        procs = [ctx.Process(target=_rank, args=(r, port, results)) for r in range(WORLD)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [p for p in procs if p.is_alive()]
        for p in hung:
            p.kill()
            p.join(5)
        out = []
        for r in range(WORLD):
            path = Path(results, f"rank{r}.json")
            out.append(json.loads(path.read_text()) if path.exists() else {"rank": r, "error": "no result (timeout)"})
        return out


def sm120check_sglang(*argv: str) -> tuple[int, dict[str, Any]]:
    sys.path.insert(0, str(REPO / "python" / "sm120check" / "src"))
    from sm120check.sglang import cli

    parser = argparse.ArgumentParser(prog="sm120check")
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["sglang", *argv, "--json"])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = args.handler(args)
    return status, json.loads(buf.getvalue())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cc", default="9.0", help="compute capability to patch for (the H200 is 9.0)")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds for each 2-rank phase")
    opts = parser.parse_args()
    os.environ.update(SAFE_ENV)
    os.environ.update(SGLANG_ENV)
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.origin:
        print(
            "SGLang is not importable: install it (scripts/device/sglang-carry.sh) and set PYTHONPATH", file=sys.stderr
        )
        return 2
    source = str(Path(spec.origin).parent)
    report: dict[str, Any] = {"sglang": source, "env": {**SAFE_ENV, **SGLANG_ENV}, "cc": opts.cc}

    unpatched = run_phase(opts.timeout)
    status, patched_info = sm120check_sglang("patch", "--source", source, "--cc", opts.cc)
    report["patch"] = {"status": status, "files": patched_info.get("files"), "error": patched_info.get("error")}
    patched = run_phase(opts.timeout) if status == 0 else []
    revert_status, _ = sm120check_sglang("patch", "--revert", "--source", source)
    report.update(unpatched=unpatched, patched=patched, revert_status=revert_status)

    ok_unpatched = all(r.get("disabled") is True and "error" not in r for r in unpatched)
    ok_patched = len(patched) == WORLD and all(
        r.get("disabled") is False
        and "error" not in r
        and r.get("checks")
        and all(c["ran"] and c["ok"] for c in r["checks"])
        for r in patched
    )
    for phase, ranks in (("unpatched", unpatched), ("patched", patched)):
        for r in ranks:
            checks = r.get("checks") or []
            summary = ", ".join(
                f"{c['elements']}: " + ("equal" if c.get("equal") else f"max diff {c.get('max_abs_diff')}")
                for c in checks
            )
            state = "error " + str(r["error"]) if "error" in r else ("disabled" if r.get("disabled") else "enabled")
            warn = next((m for m in r.get("log", []) if "not supported" in m), "")
            print(
                f"{phase} rank {r['rank']}: {state}"
                + (f" ({warn})" if warn else "")
                + (f"; vs NCCL {summary}" if summary else "")
            )
    print(f"patch: exit {status}, {len(patched_info.get('files') or [])} files; revert: exit {revert_status}")
    verdict = ok_unpatched and ok_patched and revert_status == 0
    report["verdict"] = {"unpatched_disabled": ok_unpatched, "patched_matches_nccl": ok_patched, "pass": verdict}
    print("PASS" if verdict else "FAIL", json.dumps(report["verdict"]))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "sglang_symm_mem.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
