"""Ask ninja what loading a cached module would do.

FlashInfer 0.7.x loads a JIT module by running `ninja -C <module dir> -f <module dir>/build.ninja` first, so a
module is cached exactly when that run has no work. `ninja -n -d explain` answers without compiling anything and
without writing ninja's logs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sm120check import bounded

NO_WORK = "ninja: no work to do."
_EXPLAIN = "ninja explain: "
NO_NINJA = (
    "no `ninja` on PATH: FlashInfer runs it by name on every load and fails without it "
    "(put the stack venv's bin directory, which has the pinned ninja, on the servers' PATH)"
)


@dataclass(frozen=True)
class NinjaVerdict:
    clean: bool  # a load runs no command
    commands: int  # commands a load would run (compiles and links)
    reasons: tuple[str, ...]  # ninja's own explanations, first ones
    # A load builds the module from nothing (no build file, or one written for another path): ninja cannot count
    # the commands before FlashInfer writes the build file, so `commands` is 0 although every source compiles.
    whole: bool = False

    def summary(self) -> str:
        if self.clean:
            return "ninja has no work: loads without compiling"
        why = self.reasons[0] if self.reasons else "ninja gave no reason"
        if self.whole:
            return f"a load would build the whole module (write build.ninja, compile every source, link): {why}"
        return f"a load would run {self.commands} build command(s): {why}"


BUILD_FILE_BYTES = 64 << 20  # a FlashInfer module's build.ninja is a few KiB


def find_ninja(env: Mapping[str, str] | None = None) -> str | None:
    """The ninja FlashInfer runs: `ninja` on the process's PATH (flashinfer/jit/cpp_ext.py runs it by name).

    Only that one may judge the cache: ninja rewrites a log written by another version (1.11 writes v5, 1.13 v7)
    and forgets every record in it, so the next load compiles everything.
    """
    return shutil.which("ninja", path=(os.environ if env is None else env).get("PATH"))


def ninja_version(ninja: str | None) -> str:
    if ninja is None:
        return "absent"
    try:
        out = subprocess.run([ninja, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unusable"
    return out.stdout.strip() or "unknown"


def dry_run(module_dir: Path, ninja: str = "ninja", timeout: float = 60.0) -> NinjaVerdict:
    build_file = module_dir / "build.ninja"
    if not build_file.is_file():
        return NinjaVerdict(False, 0, (f"{build_file} is missing (never built here)",), whole=True)
    try:
        elsewhere = foreign_target(build_file)
    except bounded.Unreadable as exc:
        return NinjaVerdict(False, 0, (f"{exc}: not a build file ninja can use",))
    if elsewhere:
        return NinjaVerdict(
            False,
            0,
            (f"{build_file} builds {elsewhere}: written for another cache path, a load rewrites and rebuilds",),
            whole=True,
        )
    try:
        out = subprocess.run(
            [ninja, "-n", "-d", "explain", "-C", str(module_dir.resolve()), "-f", str(build_file.resolve())],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return NinjaVerdict(False, 0, (f"{ninja} could not run: {exc}",))
    return parse_dry_run(out.stdout, out.stderr, out.returncode)


def foreign_target(build_file: Path) -> str:
    """The default target of a FlashInfer build file when it lies outside the file's own directory, else ""."""
    for line in bounded.read_text(build_file, BUILD_FILE_BYTES, lenient=True).splitlines():
        if line.startswith("default "):
            target = Path(line.split(None, 1)[1].strip())
            here = build_file.parent
            return "" if target.parent in (here, here.resolve()) else str(target)
    return ""


def parse_dry_run(stdout: str, stderr: str, returncode: int) -> NinjaVerdict:
    lines = (stdout + "\n" + stderr).splitlines()
    reasons = tuple(dict.fromkeys(line[len(_EXPLAIN) :] for line in lines if line.startswith(_EXPLAIN)))
    commands = sum(1 for line in stdout.splitlines() if line.startswith("["))
    if returncode != 0:
        error = next((line for line in lines if line.startswith("ninja: error")), f"ninja exited {returncode}")
        return NinjaVerdict(False, commands, (error, *reasons[:4]))
    clean = commands == 0 and NO_WORK in stdout
    return NinjaVerdict(clean, commands, reasons[:5])
