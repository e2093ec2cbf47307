#!/usr/bin/env python3
"""The SGLang 0.5.16 server stack for the lent H200 machine: built here, carried as one archive, installed there.

The GPU image has Python 3.12, torch 2.11.0+cu130, triton 3.6, transformers 5.17 and most of SGLang's small
dependencies, but no SGLang. SGLang 0.5.16 pins torch==2.11.0 (the image's), so its server runs on the image's torch
with these wheels on top (PYTHONPATH first, so transformers 5.12.1 and tokenizers 0.22.2 shadow the image's).

    python3 scripts/device/sglang_stack.py build    # here: download the pins, install them for cp312, prune, pack
    python3 scripts/device/sglang_stack.py install  # there: check the sha256, make --venv (the stack venv) of it

What is pruned, and why (the device tool carries 64 MiB a call):
- sglang-kernel 0.4.5: flash_ops (FA3, 1.1 GB unpacked), sm100/ (Blackwell datacenter), flashmla_ops and
  infllm_ops (loaded lazily by MLA and InfLLM backends). `import sgl_kernel` loads sm90/common_ops on an H200; the
  server runs with `--attention-backend triton` and `--sampling-backend pytorch` (FA3 is not carried; FlashInfer
  0.6.14 is, because SGLang's sampler imports flashinfer.sampling at module level, but without the CUTLASS, CCCL and
  spdlog headers its JIT builds need: nothing of FlashInfer's is compiled or run by this server).
- bin/: console scripts, but py-spy (the sampling profiler the envelope's host profile runs) moves to sm120kit_bin/.
- sglang: multimodal_gen/, test/, benchmark/, srt/grpc/ (a 7 MB Rust extension the HTTP server never imports),
  and every __pycache__; xgrammar's static C++ library, zstandard's CFFI backend, tvm-ffi's bundled sources.
Not carried because the server never imports them eagerly for a Llama model (a static walk of module-level imports
from sglang.launch_server, the scheduler, model runner, llama, llama_eagle3, the EAGLE workers and the triton
backend; see `closure`; imports under `if is_cuda():` count as guarded there, which is how flashinfer was missed
until the GPU run named it): flash-attn-4, torchao, outlines, llguidance, tilelang, deep-gemm, quack, helion.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / ".carry" / "sglang-0.5.16"
CACHE = Path.home() / ".cache" / "sm120kit" / "wheels-cp312"
SGLANG = "0.5.16"
# Exact pins. SGLang 0.5.16's own pins where it has one (sglang-kernel, transformers, xgrammar, openai, soundfile,
# apache-tvm-ffi); otherwise the release on the index that satisfies every requirement below.
PINS = (
    f"sglang=={SGLANG}",
    "sglang-kernel==0.4.5",
    "flashinfer-python==0.6.14",  # srt/layers/sampler.py imports flashinfer.sampling at module level on CUDA
    "sgl-deep-gemm==0.1.4.post1",  # the EAGLE worker's graph capture imports dsa_backend, which imports deep_gemm
    "transformers==5.12.1",
    "tokenizers==0.22.2",  # transformers 5.12.1 asks <=0.23.0 and checks it at import; the image has 0.23.2
    "xgrammar==0.2.1",
    "apache-tvm-ffi==0.1.11",
    "openai==2.6.1",
    "jiter==0.19.0",
    "distro==1.9.0",
    "sniffio==1.3.1",
    "soundfile==0.13.1",
    "cffi==2.1.1",
    "pycparser==3.12",
    "fastapi==0.165.0",
    "starlette==1.10.0",
    "annotated-doc==0.0.7",
    "opentelemetry-api==1.45.2",
    "uvicorn==0.54.0",
    "python-multipart==0.0.34",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "orjson==3.13.0",
    "pybase64==1.5.1",
    "msgspec==0.23.0",
    "pyzmq==27.3.0",
    "setproctitle==1.3.8",
    "zstandard==0.25.0",
    "partial-json-parser==0.2.1.1.post7",
    "compressed-tensors==0.20.1",
    "loguru==0.7.3",
    "dill==0.4.1",
    "gguf==0.19.0",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "ipython==9.18.1",
    "ipython-pygments-lexers==1.1.1",
    "decorator==5.3.1",
    "matplotlib-inline==0.2.2",
    "pexpect==4.9.0",
    "ptyprocess==0.7.0",
    "prompt-toolkit==3.0.53",
    "wcwidth==0.9.4",
    "stack-data==0.6.3",
    "executing==2.3.0",
    "asttokens==3.0.2",
    "pure-eval==0.2.4",
    "traitlets==5.16.1",
    "py-spy==0.4.3",  # the envelope's host profile (tests/lab/host_profile.py) runs its binary
)
PRUNE = (
    "sgl_kernel/flash_ops.abi3.so",
    "sgl_kernel/sm100",
    "sgl_kernel/flashmla_ops.abi3.so",
    "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so",
    "sglang/multimodal_gen",
    "sglang/test",
    "sglang/benchmark",
    "sglang/srt/grpc",
    "xgrammar/lib/libxgrammar.a",  # a static library for C++ users (65 MB); Python loads libxgrammar_bindings.so
    "zstandard/_cffi.cpython-312-x86_64-linux-gnu.so",  # the CFFI backend; zstandard imports backend_c
    "tvm_ffi/3rdparty",  # headers and sources for building extensions
    "tvm_ffi/src",
    "flashinfer/data/cccl",  # headers for FlashInfer's JIT builds; this server JIT-compiles nothing of FlashInfer's
    "flashinfer/data/cutlass",
    "flashinfer/data/spdlog",
    "bin",  # console scripts; KEEP_BIN moves the ones the tests run out first
)
# Executables of the wheels' scripts (bin/) that the GPU tests run, kept in site-packages/sm120kit_bin.
KEEP_BIN = ("py-spy",)
KEEP_DIR = "sm120kit_bin"
_GLIBC = (17, 24, 27, 28, 31, 34)
PLATFORMS = (*(f"manylinux_2_{n}_x86_64" for n in _GLIBC), "manylinux2014_x86_64", "manylinux1_x86_64")


@dataclass(frozen=True)
class Wheel:
    file: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class StackRecord:
    """stack.json beside the archive: what went in, what was cut, and the archive's own size and digest."""

    sglang: str
    python: str
    wheels: tuple[Wheel, ...]
    pruned: tuple[str, ...]
    archive: str
    archive_bytes: int
    archive_sha256: str
    unpacked_bytes: int

    @staticmethod
    def read(path: Path) -> StackRecord:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise SystemExit(f"{path}: expected a JSON object")
        try:
            wheels = tuple(Wheel(str(w["file"]), int(w["bytes"]), str(w["sha256"])) for w in raw["wheels"])
            return StackRecord(
                str(raw["sglang"]),
                str(raw["python"]),
                wheels,
                tuple(str(p) for p in raw["pruned"]),
                str(raw["archive"]),
                int(raw["archive_bytes"]),
                str(raw["archive_sha256"]),
                int(raw["unpacked_bytes"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            fix = "rebuild it with `sglang_stack.py build`"
            raise SystemExit(f"{path}: malformed stack record ({exc!r}); {fix}") from None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if run.returncode != 0:
        tail = "\n".join(line for line in run.stderr.splitlines() if "is ignored" not in line)[-3000:]
        raise SystemExit(f"pip {args[0]} failed (exit {run.returncode}):\n{tail}")


def platform_args() -> list[str]:
    args = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
    for tag in PLATFORMS:
        args += ["--platform", tag]
    return args


def wheel_for(pin: str, cache: Path) -> Path:
    """The cached wheel of one exact pin, downloaded from pip's configured index when absent."""
    name, version = pin.split("==")
    stem = name.replace("-", "_").lower()
    found = [p for p in cache.glob("*.whl") if p.name.lower().startswith(f"{stem}-{version}-")]
    if not found:
        print(f"  download {pin}", flush=True)
        pip("download", "--no-deps", *platform_args(), "-d", str(cache), pin)
        found = [p for p in cache.glob("*.whl") if p.name.lower().startswith(f"{stem}-{version}-")]
    if len(found) != 1:
        raise SystemExit(f"{pin}: expected one wheel in {cache}, found {[p.name for p in found]}")
    return found[0]


def build(out: Path, cache: Path) -> StackRecord:
    cache.mkdir(parents=True, exist_ok=True)
    print(f"wheels for SGLang {SGLANG} (cp312) in {cache}", flush=True)
    wheels = [wheel_for(pin, cache) for pin in PINS]
    with tempfile.TemporaryDirectory(prefix="sglang-stack-") as tmp:
        site = Path(tmp) / "site"
        print(f"install {len(wheels)} wheels into a staging site (no deps)", flush=True)
        pip("install", "--no-deps", "--no-compile", *platform_args(), "--target", str(site), *map(str, wheels))
        keep = site / KEEP_DIR
        keep.mkdir()
        for name in KEEP_BIN:
            if not (site / "bin" / name).is_file():
                raise SystemExit(f"{site / 'bin' / name} is missing: the wheel that installs it is not in PINS")
            shutil.move(str(site / "bin" / name), keep / name)
        pruned = []
        for rel in PRUNE:
            target = site / rel
            if target.is_dir():
                shutil.rmtree(target)
                pruned.append(rel)
            elif target.exists():
                target.unlink()
                pruned.append(rel)
        for cache_dir in list(site.rglob("__pycache__")):
            shutil.rmtree(cache_dir, ignore_errors=True)
        unpacked = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
        out.mkdir(parents=True, exist_ok=True)
        archive = out / "stack.tar.xz"
        partial = archive.with_suffix(".partial")
        print(f"pack {unpacked / 2**20:.0f} MiB (xz)", flush=True)
        with tarfile.open(partial, "w:xz", preset=6) as tar:
            tar.add(site, arcname=".")
        partial.replace(archive)
    record = StackRecord(
        SGLANG,
        "cp312",
        tuple(Wheel(w.name, w.stat().st_size, sha256(w)) for w in wheels),
        tuple(pruned),
        archive.name,
        archive.stat().st_size,
        sha256(archive),
        unpacked,
    )
    (out / "stack.json").write_text(json.dumps(asdict(record), indent=1) + "\n", encoding="utf-8")
    print(f"{archive}: {record.archive_bytes / 2**20:.1f} MiB, sha256 {record.archive_sha256}", flush=True)
    return record


def install(src: Path, venv: Path) -> None:
    """A venv at `venv` whose site-packages is the archive, with the running interpreter's site-packages after it
    (a .pth line): the stack's own pins shadow the image's, torch and the rest come from the image. Idempotent:
    a venv already holding this archive (its sha256 stamp) is left as it is."""
    record = StackRecord.read(src / "stack.json")
    archive = src / record.archive
    intact = archive.is_file() and archive.stat().st_size == record.archive_bytes
    if not intact or sha256(archive) != record.archive_sha256:
        raise SystemExit(f"{archive} does not match stack.json (size or sha256): rebuild and carry it again")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = venv / "lib" / version / "site-packages"
    stamp = site / ".sm120kit-stack.sha256"
    if stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == record.archive_sha256:
        print(f"{venv}: already holds this stack", flush=True)
        return
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    staging = site.with_name("site-packages.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(staging, filter="data")
    image_site = sysconfig.get_paths()["purelib"]
    (staging / "zz-image-site.pth").write_text(image_site + "\n", encoding="utf-8")
    (staging / stamp.name).write_text(record.archive_sha256 + "\n", encoding="utf-8")
    shutil.rmtree(site)
    staging.replace(site)
    print(
        f"{venv}: SGLang {record.sglang} stack, {len(record.wheels)} wheels, {record.unpacked_bytes >> 20} MiB, "
        f"then {image_site}",
        flush=True,
    )


def closure(source: Path, entries: list[str]) -> dict[str, bool]:
    """Third-party top-level packages imported at module level from these SGLang modules, followed through SGLang's
    own modules: name -> True when some import of it is unguarded (not inside try, if or a TYPE_CHECKING block)."""
    seen: set[str] = set()
    eager: dict[str, bool] = {}

    def module_file(name: str) -> tuple[Path | None, bool]:
        base = source / Path(*name.split("."))
        if (base / "__init__.py").is_file():
            return base / "__init__.py", True
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py"), False
        return None, False

    def imports(body: list[ast.stmt], guarded: bool, out: list[tuple[str, int, list[str], bool]]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                out += [(a.name, 0, [], guarded) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                out.append((node.module or "", node.level, [a.name for a in node.names], guarded))
            elif isinstance(node, ast.Try):
                imports(node.body, True, out)
                for handler in node.handlers:
                    imports(handler.body, guarded, out)
                imports(node.orelse + node.finalbody, guarded, out)
            elif isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    imports(node.body, True, out)
                imports(node.orelse, True, out)
            elif isinstance(node, (ast.ClassDef, ast.With)):
                imports(node.body, guarded, out)

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        path, is_package = module_file(name)
        if path is None:
            return
        parts = name.split(".")
        for i in range(1, len(parts)):
            visit(".".join(parts[:i]))
        found: list[tuple[str, int, list[str], bool]] = []
        imports(ast.parse(path.read_text(encoding="utf-8")).body, False, found)
        package = parts if is_package else parts[:-1]
        for module, level, names, guarded in found:
            full = ".".join((package[: len(package) - level + 1] if level else []) + ([module] if module else []))
            top = full.split(".")[0]
            if top == "sglang":
                visit(full)
                for n in names:
                    if module_file(f"{full}.{n}")[0] is not None:
                        visit(f"{full}.{n}")
            elif top not in sys.stdlib_module_names and top != "__future__":
                eager[top] = eager.get(top, False) or not guarded

    for entry in entries:
        visit(entry)
    return eager


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="download the pins, install for cp312, prune, pack (on a machine with pip)")
    b.add_argument("--out", type=Path, default=DEFAULT_OUT)
    b.add_argument("--cache", type=Path, default=CACHE)
    i = sub.add_parser("install", help="check the archive and unpack it (on the GPU machine)")
    i.add_argument("--from", dest="src", type=Path, default=DEFAULT_OUT)
    i.add_argument("--venv", type=Path, default=Path("/tmp/sglang-venv"))
    c = sub.add_parser("closure", help="third-party packages SGLang's server modules import at module level")
    c.add_argument("source", type=Path, help="an unpacked SGLang tree (the directory holding sglang/)")
    c.add_argument("entries", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.out, args.cache)
    elif args.command == "install":
        install(args.src, args.venv)
    else:
        for name, unguarded in sorted(closure(args.source, args.entries).items()):
            print(f"{name:28s} {'eager' if unguarded else 'guarded'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
