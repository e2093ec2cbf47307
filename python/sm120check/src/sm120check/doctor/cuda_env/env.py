"""The CUDA 13 environment: the stack venv's start-up hook runs in a fresh interpreter and sets the manifest's env."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from sm120check.doctor import child, remedies, stackenv
from sm120check.doctor.model import Context, Result, Status

HOOK_MODULE = "sm120kit_env"

# Run by the stack venv's interpreter: what its start-up left behind.
_PROBE = """
import json, os, sys
sc = sys.modules.get("sitecustomize")
hook = sys.modules.get("sm120kit_env")
print(json.dumps({
    "env": dict(os.environ),
    "sitecustomize": getattr(sc, "__file__", None) if sc else None,
    "hook": getattr(hook, "__file__", None) if hook else None,
    "executable": sys.executable,
}))
"""


def fresh_interpreter(python: str, drop: Sequence[str], timeout: float) -> tuple[dict[str, object] | None, str]:
    """Start `python` with the manifest's variables removed, so only its start-up hook can set them."""
    env = {k: v for k, v in os.environ.items() if k not in set(drop) and k != "SM120KIT_ENV"}
    proc = child.run_command([python, "-c", _PROBE], timeout=timeout, env=env)  # own process group, killed whole
    if proc.returncode != 0:
        return None, proc.stderr.strip()[-2000:]
    try:
        value = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, RecursionError, IndexError):
        return None, f"no JSON from {python}: {proc.stdout[-500:]}"
    return value if isinstance(value, dict) else None, ""


def _matches(name: str, want: str, got: str | None) -> bool:
    if got is None:
        return False
    if name.endswith("PATH") and os.pathsep in want:
        return all(part in got.split(os.pathsep) for part in want.split(os.pathsep) if part)
    return got == want


def env_verdict(
    seen: Mapping[str, object], want: Mapping[str, str], venv_sitecustomize: Sequence[str], pth_files: Sequence[str]
) -> Result:
    """Verdict from a fresh interpreter's report, the manifest's env, the venv's sitecustomize.py and .pth files."""
    env = seen.get("env", {})
    env = env if isinstance(env, dict) else {}
    hook = seen.get("hook")
    active_sc = seen.get("sitecustomize")
    data: dict[str, object] = {"hook": hook, "sitecustomize": active_sc, "pth": list(pth_files)}
    shadowed = [
        p for p in venv_sitecustomize if not active_sc or os.path.realpath(p) != os.path.realpath(str(active_sc))
    ]
    shadow_note = (
        f"{', '.join(shadowed)} never runs: {active_sc or 'another sitecustomize'} comes first on sys.path"
        if shadowed
        else ""
    )
    if not hook:
        why = "no hook file" if not pth_files else f"{', '.join(pth_files)} exists but did not import {HOOK_MODULE}"
        return Result(
            "env",
            Status.FAIL,
            f"the {HOOK_MODULE} start-up hook is not active in the stack venv ({why})",
            details="\n".join(t for t in (shadow_note, f"sitecustomize in use: {active_sc}") if t),
            remedy=remedies.env_hook(HOOK_MODULE),
            data=data,
        )
    wrong = {k: env.get(k) for k, v in want.items() if not _matches(k, v, env.get(k))}
    data["vars"] = len(want)
    data["wrong"] = len(wrong)
    if wrong:
        lines = [f"{k}: wants {_shown(k, want[k])}, a fresh interpreter sees {_shown(k, v)}" for k, v in wrong.items()]
        return Result(
            "env",
            Status.FAIL,
            f"the hook runs but {len(wrong)} variable(s) differ from the manifest: {', '.join(wrong)}",
            details="\n".join([*lines, shadow_note]).strip(),
            remedy=remedies.env_hook(HOOK_MODULE),
            data=data,
        )
    if shadowed:
        return Result(
            "env",
            Status.WARN,
            f"hook {hook} sets {len(want)} variable(s), but a venv sitecustomize.py is shadowed",
            details=shadow_note,
            remedy=remedies.ENV_DEAD_FILE,
            data=data,
        )
    compared = f"sets the manifest's {len(want)} variable(s)" if want else "is active (no manifest to compare)"
    return Result("env", Status.PASS, f"hook {hook} {compared} in a fresh interpreter", data=data)


# Names that usually hold credentials (the same words preflight warns about): their values never reach a report.
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")


def _shown(name: str, value: object) -> str:
    """How a value appears in the report: redacted (with its length) when the name looks like a credential."""
    if value is not None and any(word in name.upper() for word in SECRET_WORDS):
        return f"<redacted, {len(str(value))} characters>"
    return repr(value)


class EnvCheck:
    """A fresh interpreter of the stack venv runs the sm120kit_env hook and sees the manifest's environment."""

    id: ClassVar[str] = "env"
    family: ClassVar[str] = "cuda_env"
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ()
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        want = dict(ctx.manifest.env) if ctx.manifest else {}
        python = ctx.facts.venv_python
        sites = stackenv.site_packages(ctx.facts.venv)
        pth = [str(p / f"{HOOK_MODULE}.pth") for p in sites if (p / f"{HOOK_MODULE}.pth").exists()]
        custom = [str(p / "sitecustomize.py") for p in sites if (p / "sitecustomize.py").exists()]
        if not Path(python).exists():
            return Result(
                self.id,
                Status.FAIL,
                f"the stack venv's interpreter {python} does not exist",
                remedy=remedies.STACK_VENV,
            )
        seen, error = fresh_interpreter(str(python), list(want), timeout=min(ctx.timeout, 30))
        if seen is None:
            return Result(
                self.id,
                Status.FAIL,
                f"{python} does not start cleanly",
                details=error,
                remedy=remedies.env_hook(HOOK_MODULE),
            )
        if not want and not seen.get("hook") and not pth:
            return Result(
                self.id,
                Status.WARN,
                "no sm120kit_env hook and no manifest env to compare: the CUDA 13 environment is not set",
                details=f"sitecustomize in use: {seen.get('sitecustomize')}",
                remedy=remedies.env_hook(HOOK_MODULE),
            )
        return env_verdict(seen, want, custom, pth)


CHECKS = (EnvCheck,)
