"""The launch files tests/gpu starts its SGLang servers from are what the sglang_server role renders now
(scripts/device/render_launch.py runs the role with ansible-playbook): a role change that alters the command
fails here until the files are rendered again, so the GPU runs never test a command users would not get."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_launch", ROOT / "scripts" / "device" / "render_launch.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["render_launch"] = module
    spec.loader.exec_module(module)
    return module


def test_the_committed_launch_files_are_the_roles_rendering(tmp_path: Path) -> None:
    written = renderer().render_all(tmp_path)
    names = [
        "bad-draft.txt",
        "base.txt",
        "fusion-on-one-gpu.txt",
        "no-graphs.txt",
        "policy.txt",
        "sglang-adaptive.txt",
        "spec.txt",
    ]
    assert sorted(p.name for p in written) == [*names, "wait.json"]
    for path in written:
        committed = ROOT / "tests" / "gpu" / "launch" / path.name
        assert committed.read_text() == path.read_text(), f"{committed}: run scripts/device/render_launch.py"
    base = (tmp_path / "base.txt").read_text()
    assert "--enforce-disable-flashinfer-allreduce-fusion" in base and "--enable-torch-symm-mem" not in base
    assert "--speculative-algorithm EAGLE3" in (tmp_path / "spec.txt").read_text()
    bad = (tmp_path / "bad-draft.txt").read_text()
    assert "--model-path /tmp/sm120kit-models/bad-draft/target" in bad
    assert "--speculative-draft-model-path /tmp/sm120kit-models/bad-draft/draft" in bad
