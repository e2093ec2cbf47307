"""The launch files tests/gpu starts its SGLang servers from are what the sglang_server role renders now
(scripts/device/render_launch.py runs the role with ansible-playbook): a role change that alters the command
fails here until the files are rendered again, so the GPU runs never test a command users would not get."""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pytest

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
        "policy-uncapped.txt",
        "policy.txt",
        "sglang-adaptive.txt",
        "spec-7.txt",
        "spec.txt",
        "zero-step.txt",
        "spec-uncapped.txt",
        "spec-7-uncapped.txt",
        "switch.txt",
        "switch-7.txt",
    ]
    envs = [name.replace(".txt", ".env") for name in names]
    assert sorted(p.name for p in written) == sorted([*names, *envs, "wait.json"])
    for path in written:
        committed = ROOT / "tests" / "gpu" / "launch" / path.name
        assert committed.read_text() == path.read_text(), f"{committed}: run scripts/device/render_launch.py"
    base = (tmp_path / "base.txt").read_text()
    assert "--enforce-disable-flashinfer-allreduce-fusion" in base and "--enable-torch-symm-mem" not in base
    assert "--speculative-algorithm EAGLE3" in (tmp_path / "spec.txt").read_text()
    deeper = shlex.split((tmp_path / "spec-7.txt").read_text())
    assert spec_numbers(deeper) == (7, 1, 8) and "--speculative-adaptive" not in deeper
    # rendered after the adaptive plays in the same ansible-playbook run: the role's facts outlive a play, and a
    # sized-for-adaptive step count once leaked into these two (the envelope's 7-step curve ran 3 steps)
    for name in ("spec-7-uncapped.txt", "switch-7.txt"):
        assert spec_numbers(shlex.split((tmp_path / name).read_text())) == (7, 1, 8), name
    bad = (tmp_path / "bad-draft.txt").read_text()
    assert "--model-path /tmp/sm120kit-models/bad-draft/target" in bad
    assert "--speculative-draft-model-path /tmp/sm120kit-models/bad-draft/draft" in bad
    # the 0-step sweep's server: crossover's measuring file, its unreached slot's 3 steps launched, uncapped
    zero = (tmp_path / "zero-step.txt").read_text()
    assert "--speculative-adaptive-config /tmp/sm120kit-policy/sglang-zero-step.json" in zero
    assert "--speculative-num-steps 3 " in zero and "--max-running-requests 256" in zero
    # the speculation switch: a static launch (no adaptive mode) and its threshold in the unit's environment only
    switch = shlex.split((tmp_path / "switch.txt").read_text())
    assert "--speculative-adaptive" not in switch and "--max-running-requests" in switch
    assert 'SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS="30"' in (tmp_path / "switch.env").read_text().splitlines()
    assert "SGLANG_SM120KIT" not in (tmp_path / "spec-uncapped.env").read_text()


def test_the_gpu_tests_start_the_servers_with_the_roles_environment_file() -> None:
    """The 0-step sweep and the policy server skip the 0-step draft extend alike (SGLang's
    SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND); the plain and EAGLE-3 servers run with the role's default environment
    only. Read by the parser tests/gpu's start() uses, which refuses a line the unit's template cannot have written."""
    from lab.sglang_gpu import environment_file

    launch = ROOT / "tests" / "gpu" / "launch"
    skip = {"SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1"}
    default = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    for name in ("zero-step", "policy", "policy-uncapped"):
        assert environment_file(launch / f"{name}.env") == default | skip, name
    for name in ("base", "spec", "spec-7", "sglang-adaptive", "bad-draft", "no-graphs"):
        assert environment_file(launch / f"{name}.env") == default, name


def test_the_environment_file_parser_undoes_the_roles_escaping(tmp_path: Path) -> None:
    from lab.sglang_gpu import environment_file

    path = tmp_path / "environment"
    path.write_text('# Ansible managed\nA="x\\$HOME\\`id\\`\\"\\\\y \' %n"\n\nB="two  spaces"\n')
    assert environment_file(path) == {"A": "x$HOME`id`\"\\y ' %n", "B": "two  spaces"}
    path.write_text("A=unquoted\n")
    with pytest.raises(ValueError, match="A=unquoted"):
        environment_file(path)


def spec_numbers(argv: list[str]) -> tuple[int, int, int]:
    flags = ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")
    steps, topk, tokens = (int(argv[argv.index(flag) + 1]) for flag in flags)
    return steps, topk, tokens


def test_the_adaptive_launches_start_at_their_configs_largest_candidate_step() -> None:
    """sglang-adaptive.txt (SGLang's built-in config, candidates up to 7) crashed at start with 3 steps on SGLang 0.5.16
    (sglang#30549); it launches with 7 steps and 8 draft tokens now. policy.txt stays at 3 / 4, the largest candidate
    of the policy the GPU test writes: the one of the 2026-12-02 run (3-step sweeps) has 3."""
    launch = ROOT / "tests" / "gpu" / "launch"
    assert spec_numbers(shlex.split((launch / "sglang-adaptive.txt").read_text())) == (7, 1, 8)
    policy = shlex.split((launch / "policy.txt").read_text())
    assert spec_numbers(policy) == (3, 1, 4)
    real = json.loads((ROOT / "docs/validation/2026-12-02-h200-sglang-server/policy-file-run3.json").read_text())
    largest = max(step for key, slot in real.items() if key.isdigit() for step in slot["candidate_steps"])
    assert largest == renderer().POLICY_MAX_STEP == spec_numbers(shlex.split((launch / "spec.txt").read_text()))[0]


def test_the_uncapped_policy_launch_is_the_policy_launch_with_256_running_requests() -> None:
    launch = ROOT / "tests" / "gpu" / "launch"
    policy = shlex.split((launch / "policy.txt").read_text())
    uncapped = shlex.split((launch / "policy-uncapped.txt").read_text())
    at = uncapped.index("--max-running-requests")
    assert uncapped[at : at + 2] == ["--max-running-requests", "256"]
    assert uncapped[:at] + uncapped[at + 2 :] == policy
    assert "--max-running-requests" not in policy


def test_a_file_as_out_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a-file"
    out.write_text("")
    assert renderer().main(["--out", str(out)]) == 2  # was a FileExistsError traceback (probe 3 EN9)
    assert capsys.readouterr().err == f"render_launch: --out {out}: File exists; give a writable directory\n"


def test_rendering_replaces_a_link_planted_at_a_file_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("ORIGINAL\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "base.txt").symlink_to(victim)  # was written through (probe 3 EN8)
    renderer().render_all(out)
    assert victim.read_text() == "ORIGINAL\n" and not (out / "base.txt").is_symlink()
