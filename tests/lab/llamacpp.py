"""llama.cpp's `llama-server`, built once per machine from the llama.cpp vendored in a pinned llama-cpp-python sdist.

The build lives outside the checkout, keyed by version:
`${SM120KIT_CACHE:-${XDG_CACHE_HOME:-~/.cache}/sm120kit}/llama-server/<version>/` holds `bin/llama-server`, a copy
of llama.cpp's `gguf-py/` (the model writer in gguf_models.py imports it) and `stamp.json` (version, commit, cmake
flags). A build is assembled in a staging directory, the stamp written last, then renamed into place, so an
interrupted build never looks finished. An exclusive lock file makes a second process (CI's background build and a
pytest worker) wait for the first instead of building twice.

    python tests/lab/llamacpp.py build [--from-build CMAKE_BUILD_DIR]   # prints the binary's path
    python tests/lab/llamacpp.py path                                   # exit 1 when not built
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"
LLAMA_CPP_COMMIT = "0c1e57098"  # the llama.cpp vendored in that sdist (`llama-server --version`)
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # left on, the build downloads the web UI
    f"-DLLAMA_BUILD_COMMIT={LLAMA_CPP_COMMIT}",
)
TOOLS = {"cmake": "cmake", "ninja": "ninja-build", "g++": "g++"}  # executable -> Debian package
LOCK_WAIT_S = 3600.0
DOWNLOAD_TIMEOUT_S = 900.0
CONFIGURE_TIMEOUT_S = 600.0
BUILD_TIMEOUT_S = 3600.0
Progress = Callable[[str], None]


class BuildError(Exception):
    """llama-server could not be built or found; the message says why and what to do."""


@dataclass(frozen=True)
class LlamaServerBuild:
    """A finished, stamped build in the cache."""

    root: Path
    version: str
    commit: str

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "llama-server"

    @property
    def gguf_py(self) -> Path:
        return self.root / "gguf-py"


def cache_root() -> Path:
    if explicit := os.environ.get("SM120KIT_CACHE"):
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "sm120kit"


def build_dir(version: str = LLAMA_CPP_PYTHON) -> Path:
    return cache_root() / "llama-server" / version


def log_path(version: str = LLAMA_CPP_PYTHON) -> Path:
    """Where `build` writes the tools' output (pip, cmake, ninja); its tail goes into every failure message."""
    return cache_root() / "llama-server" / f"{version}.build.log"


def failure_path(version: str = LLAMA_CPP_PYTHON) -> Path:
    """Written when a build fails (its message), removed when the next build starts."""
    return cache_root() / "llama-server" / f"{version}.failed"


def expected_stamp(version: str = LLAMA_CPP_PYTHON) -> dict[str, object]:
    return {"version": version, "commit": LLAMA_CPP_COMMIT, "flags": list(CMAKE_FLAGS)}


def cached_build(version: str = LLAMA_CPP_PYTHON) -> LlamaServerBuild | None:
    """The finished build of `version` when its stamp matches the pinned commit and flags, else None."""
    root = build_dir(version)
    try:
        stamp = json.loads((root / "stamp.json").read_text())
    except (OSError, ValueError):
        return None
    if stamp != expected_stamp(version) or not os.access(root / "bin" / "llama-server", os.X_OK):
        return None
    if not (root / "gguf-py" / "gguf" / "__init__.py").is_file():
        return None
    return LlamaServerBuild(root, version, LLAMA_CPP_COMMIT)


def missing_tools() -> list[str]:
    """The build tools this machine lacks, as Debian package names."""
    return [package for tool, package in TOOLS.items() if shutil.which(tool) is None]


def log_tail(version: str = LLAMA_CPP_PYTHON, lines: int = 40) -> str:
    try:
        text = log_path(version).read_text(errors="replace")
    except OSError:
        return "(no build log)"
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def _exclusive(lock: Path, wait_s: float, say: Progress) -> Iterator[None]:
    """Hold an exclusive flock on `lock`; wait (bounded) while another process holds it."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a+") as fh:
        deadline = time.monotonic() + wait_s
        announced = False
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not announced:
                    fh.seek(0)
                    holder = fh.read().strip() or "another process"
                    say(f"llama-server: waiting for the build in progress ({holder}, lock {lock}), up to {wait_s:g} s")
                    announced = True
                if time.monotonic() > deadline:
                    raise BuildError(
                        f"another process held {lock} for more than {wait_s:g} s; if no build is running, "
                        f"remove the lock file. Build log: {log_path()}"
                    ) from None
                time.sleep(2.0)
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}\n")
        fh.flush()
        try:
            yield
        finally:
            fh.seek(0)
            fh.truncate()
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(argv: Sequence[str], timeout: float, log: Path, say: Progress, cwd: Path | None = None) -> None:
    say(f"llama-server: $ {' '.join(argv)}")
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        try:
            proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise BuildError(f"{argv[0]} ran past {timeout:g} s; see {log}\n{log_tail()}") from None
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(argv[:3])} ... exited {proc.returncode}; see {log}\n{log_tail()}")


def _check_build_tree(cmake_build: Path) -> Path:
    """The llama.cpp source tree of a finished cmake build directory made with exactly CMAKE_FLAGS."""
    try:
        cache = (cmake_build / "CMakeCache.txt").read_text()
    except OSError as exc:
        raise BuildError(f"--from-build {cmake_build}: no CMakeCache.txt ({exc.strerror})") from None
    entries = {}
    for line in cache.splitlines():
        if ":" in line and "=" in line and not line.startswith(("//", "#")):
            key, _, value = line.partition("=")
            entries[key.split(":")[0]] = value
    for flag in CMAKE_FLAGS:
        key, _, value = flag[2:].partition("=")
        if entries.get(key) != value:
            raise BuildError(
                f"--from-build {cmake_build}: {key} is {entries.get(key)!r}, the pinned build needs {value!r}; "
                "build with `python tests/lab/llamacpp.py build` instead"
            )
    source = Path(entries.get("CMAKE_HOME_DIRECTORY", ""))
    if not (source / "gguf-py" / "gguf").is_dir() or not (cmake_build / "bin" / "llama-server").is_file():
        raise BuildError(f"--from-build {cmake_build}: no bin/llama-server or no gguf-py beside {source}")
    return source


def _unpack(archive: Path, dest: Path) -> None:
    with tarfile.open(archive) as tar:
        try:
            tar.extractall(dest, filter="data")
        except TypeError:  # a Python without PEP 706 filters: refuse members that leave `dest`
            for member in tar.getmembers():
                if member.name.startswith("/") or ".." in Path(member.name).parts or member.issym() or member.islnk():
                    raise BuildError(f"{archive}: refusing the unsafe member {member.name!r}") from None
            tar.extractall(dest)


def _install(staging: Path, binary: Path, source: Path, version: str) -> LlamaServerBuild:
    """Copy the binary and gguf-py into `staging`, write the stamp last, rename into place."""
    (staging / "bin").mkdir(parents=True)
    shutil.copy2(binary, staging / "bin" / "llama-server")
    shutil.copytree(source / "gguf-py", staging / "gguf-py", ignore=shutil.ignore_patterns("tests", "__pycache__"))
    (staging / "stamp.json").write_text(json.dumps(expected_stamp(version), indent=1) + "\n")
    final = build_dir(version)
    if final.exists():  # an unstamped or stale leftover
        shutil.rmtree(final)
    staging.rename(final)
    found = cached_build(version)
    if found is None:
        raise BuildError(f"installed {final} but it does not read back as a finished build")
    return found


def build(
    version: str = LLAMA_CPP_PYTHON,
    say: Progress = lambda line: print(line, file=sys.stderr, flush=True),
    from_build: Path | None = None,
    lock_wait_s: float = LOCK_WAIT_S,
) -> LlamaServerBuild:
    """The cached build of `version`, building it first when there is none (or reusing a finished cmake build
    directory with the pinned flags, `from_build`)."""
    if (found := cached_build(version)) is not None:
        return found
    if from_build is None and (missing := missing_tools()):
        raise BuildError(
            f"building llama-server needs {', '.join(missing)}: apt-get install {' '.join(missing)} "
            "(scripts/lab/setup installs them)"
        )
    parent = build_dir(version).parent
    asked = time.time()
    with _exclusive(parent / f"{version}.lock", lock_wait_s, say):
        if (found := cached_build(version)) is not None:  # built by the process we waited for
            return found
        failed = failure_path(version)
        if from_build is None and failed.is_file() and failed.stat().st_mtime >= asked:  # ... and it failed
            raise BuildError(f"the llama-server build this waited for failed: {failed.read_text().strip()}")
        staging = Path(tempfile.mkdtemp(prefix=f"{version}.staging-", dir=parent))
        staging.chmod(0o755)
        try:
            if from_build is not None:
                source = _check_build_tree(from_build)
                return _install(staging, from_build / "bin" / "llama-server", source, version)
            log = log_path(version)
            log.write_text(f"llama-server build: llama-cpp-python {version}, llama.cpp {LLAMA_CPP_COMMIT}\n")
            failure_path(version).unlink(missing_ok=True)
            try:
                return _build_from_sdist(version, parent, staging, log, say)
            except BuildError as exc:
                failure_path(version).write_text(f"{exc}\n")
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _build_from_sdist(version: str, parent: Path, staging: Path, log: Path, say: Progress) -> LlamaServerBuild:
    """pip download the sdist, configure and build llama-server only, install it into `staging`."""
    with tempfile.TemporaryDirectory(prefix=f"{version}.work-", dir=parent) as work_dir:
        work = Path(work_dir)
        spec = f"llama-cpp-python=={version}"
        download = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", spec]
        _run([*download, "-d", str(work / "dl")], DOWNLOAD_TIMEOUT_S, log, say)
        sdists = sorted((work / "dl").glob("llama_cpp_python-*.tar.gz"))
        if not sdists:
            raise BuildError(f"pip download {spec} gave no sdist in {work / 'dl'}; see {log}")
        say(f"llama-server: unpacking {sdists[0].name}")
        _unpack(sdists[0], work / "src")
        source = next((work / "src").glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"
        out = work / "build"
        configure = ["cmake", "-S", str(source), "-B", str(out), "-G", "Ninja", *CMAKE_FLAGS]
        _run(configure, CONFIGURE_TIMEOUT_S, log, say)
        jobs = str(os.cpu_count() or 2)
        _run(["cmake", "--build", str(out), "--target", "llama-server", "-j", jobs], BUILD_TIMEOUT_S, log, say)
        return _install(staging, out / "bin" / "llama-server", source, version)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llamacpp.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build llama-server into the cache (nothing to do when cached)")
    b.add_argument("--from-build", type=Path, help="install a finished cmake build directory made with the flags")
    b.add_argument("--lock-wait", type=float, default=LOCK_WAIT_S, help="seconds to wait for another build")
    sub.add_parser("path", help="print the cached binary's path; exit 1 when not built")
    args = parser.parse_args(argv)
    if args.command == "path":
        found = cached_build()
        if found is None:
            print(f"llama-server {LLAMA_CPP_PYTHON} is not built in {build_dir()}", file=sys.stderr)
            return 1
        print(found.binary)
        return 0
    try:
        result = build(from_build=args.from_build, lock_wait_s=args.lock_wait)
    except BuildError as exc:
        print(f"llamacpp.py: {exc}", file=sys.stderr)
        return 1
    print(result.binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
