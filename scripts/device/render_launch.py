#!/usr/bin/env python3
"""Render the SGLang launch commands the `sglang_server` role writes for the lent H200, with ansible-playbook,
into tests/gpu/launch/ (committed; tests/gpu/test_sglang_server.py starts the servers from these files, and
tests/ansible/test_gpu_launch_files.py fails when the role would render them differently now).

    .venv/bin/python scripts/device/render_launch.py [--out DIR]

Files: base.txt (no speculation), spec.txt (EAGLE-3, 3 steps, topk 1, 4 draft tokens), spec-7.txt (7 steps, 8
draft tokens), fusion-on-one-gpu.txt
(the base command with `sglang_server_allreduce_fusion: on`: a launch file that claims fusion on one GPU, which
verify-launch must call degraded), no-graphs.txt (the base command with --disable-cuda-graph: the server base.txt's
CUDA-graph claim is checked against), policy.txt and sglang-adaptive.txt (issue #24: EAGLE-3 with our policy file,
and with SGLang's own adaptive mode, whose largest candidate step 7 the role launches with: sglang#30549),
policy-uncapped.txt (policy.txt with --max-running-requests 256: SGLang caps a speculative server at 48),
zero-step.txt (EAGLE-3 held at 0 draft steps by crossover's sglang-zero-step.json, uncapped: the 0-step sweep),
bad-draft.txt (EAGLE-3 with a draft that is never accepted), wait.json (the role's health URL, retries and delay:
the bounded wait). Beside each NAME.txt, NAME.env: the role's systemd EnvironmentFile for it, which the GPU tests
start the server with (tests/lab/sglang_gpu.py).
No doctor report is given, so `auto` leaves fusion and symmetric memory off (fail closed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "gpu" / "launch"
# The stack venv scripts/device/sglang_stack.py makes there: SGLang's pins, then the image's torch 2.11.0+cu130.
DEVICE_PYTHON = "/tmp/sglang-venv/bin/python"
MODELS = "/tmp/sm120kit-models/serve"  # where tests/gpu writes the target and draft (tests/lab/sglang_models.py)
# The same target beside a draft whose every proposal is wrong (--draft-error 1.0): the misconfigured draft of
# sglang#21272, against which the bench must refuse to call the run speculative
BAD_MODELS = "/tmp/sm120kit-models/bad-draft"
POLICY = "/tmp/sm120kit-policy/sglang-spec-adaptive.json"  # where tests/gpu/test_sglang_policy.py puts the policy
# The role reads the policy's candidate steps on the node, but the GPU test writes the file only after the base and
# EAGLE-3 sweeps, long after this rendering (and never on this machine): the role's variable for a file written
# later states its largest candidate step instead. `sm120check crossover --write-policies` gives the first slot
# {1, k // 2, k} with k the EAGLE-3 server's --speculative-num-steps (spec.txt: 3), and every other slot less, so 3.
POLICY_MAX_STEP = 3
ZERO_STEP = "/tmp/sm120kit-policy/sglang-zero-step.json"  # beside POLICY (tests/gpu/test_sglang_policy.py ZERO_STEP)
# SGLang 0.5.16's 0-step slot still runs the draft's extend every step (2.6 x the plain server's step time at batch
# 30, docs/validation/2026-12-02-h200-policy); this experimental env of SGLang's skips it at 0 steps (an upshift then
# drafts from stale state until those requests end). The 0-step sweep and the policy server run with it alike.
SKIP_ZERO_STEP_EXTEND = {"SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1"}
POLICY_VARS: dict[str, object] = {
    "sglang_server_speculative": True,
    "sglang_server_speculative_adaptive_config": POLICY,
    "sglang_server_speculative_adaptive_max_candidate_step": POLICY_MAX_STEP,
    "sglang_server_env": SKIP_ZERO_STEP_EXTEND,
}
# The server options this stack needs on the H200 (scripts/device/sglang_stack.py says why): triton attention and
# torch sampling (FA3 and FlashInfer's JIT are not carried), no prefill CUDA graph (its capture costs a minute of
# every start; decode graphs stay on), metrics and a decode log line every 10 steps (the server's own counts).
EXTRA_ARGS = [
    "--attention-backend",
    "triton",
    "--sampling-backend",
    "pytorch",
    "--cuda-graph-backend-prefill",
    "disabled",
    "--mem-fraction-static",
    "0.8",
    "--enable-metrics",
    "--decode-log-interval",
    "10",
]
VARIANTS: dict[str, dict[str, object]] = {
    "base": {"sglang_server_speculative": False},
    "spec": {"sglang_server_speculative": True},
    # issue #24's low-load question: EAGLE-3 at 7 steps (SGLang's adaptive defaults drafted 7 at C=1-5 and beat the
    # 3-step server there), static, for the levels below the crossover
    "spec-7": {
        "sglang_server_speculative": True,
        "sglang_server_speculative_num_steps": 7,
        "sglang_server_speculative_num_draft_tokens": 8,
    },
    "fusion-on-one-gpu": {"sglang_server_speculative": False, "sglang_server_allreduce_fusion": "on"},
    # a server without CUDA graphs (SGLang 0.5.16 still takes the deprecated --disable-cuda-graph), against which
    # base.txt, which asks for them, must not be ok
    # issue #24: the EAGLE-3 server with the policy `sm120check crossover --write-policies` wrote (copied to
    # POLICY by tests/gpu/test_sglang_policy.py), and with SGLang's own adaptive steps (no file) as the anchor
    "policy": POLICY_VARS,
    "sglang-adaptive": {"sglang_server_speculative": True, "sglang_server_speculative_adaptive": True},
    # the policy server without SGLang's cap of 48 running requests for speculative servers, for the levels above 48
    "policy-uncapped": {**POLICY_VARS, "sglang_server_max_running_requests": 256},
    # the EAGLE-3 server held at 0 draft steps by the sglang-zero-step.json crossover writes (its unreached slot
    # keeps the server's 3 steps among the candidates), uncapped: the 0-step sweep `crossover --zero-step` reads
    "zero-step": {
        **POLICY_VARS,
        "sglang_server_speculative_adaptive_config": ZERO_STEP,
        "sglang_server_max_running_requests": 256,
    },
    # issue #33: the static EAGLE-3 servers uncapped (the envelope's 3- and 7-step curves), and the same servers with
    # the speculation switch's threshold (sglang_server_plain_decode_min_bs; the SGLang tree patched with
    # --plain-decode): batches of 30 or more requests run the target's plain decode. The envelope test rewrites the
    # threshold in a copy of the .env to the crossover its sweeps measured.
    "spec-uncapped": {"sglang_server_speculative": True, "sglang_server_max_running_requests": 256},
    "spec-7-uncapped": {
        "sglang_server_speculative": True,
        "sglang_server_speculative_num_steps": 7,
        "sglang_server_speculative_num_draft_tokens": 8,
        "sglang_server_max_running_requests": 256,
    },
    "switch": {
        "sglang_server_speculative": True,
        "sglang_server_max_running_requests": 256,
        "sglang_server_plain_decode_min_bs": 30,
    },
    "switch-7": {
        "sglang_server_speculative": True,
        "sglang_server_speculative_num_steps": 7,
        "sglang_server_speculative_num_draft_tokens": 8,
        "sglang_server_max_running_requests": 256,
        "sglang_server_plain_decode_min_bs": 30,
    },
    "no-graphs": {
        "sglang_server_speculative": False,
        "sglang_server_extra_args": [*EXTRA_ARGS, "--disable-cuda-graph"],
    },
    "bad-draft": {
        "sglang_server_speculative": True,
        "sglang_server_model_path": f"{BAD_MODELS}/target",
        "sglang_server_draft_model_path": f"{BAD_MODELS}/draft",
    },
}
PLAY = """- hosts: localhost
  connection: local
  gather_facts: false
  vars_files: [{vars_file}]
  roles: [sglang_server]
  post_tasks:
    - name: Write the bounded wait the role would run
      ansible.builtin.copy:
        content: "{{{{ {{'health_url': sglang_server_health_url, 'retries': sglang_server_health_retries | int,
                     'delay': sglang_server_health_delay | int}} | to_json }}}}"
        dest: "{{{{ sglang_server_config_dir }}}}/wait.json"
        mode: "0644"
      tags: [always]
"""


def variables(name: str, overrides: dict[str, object], work: Path) -> dict[str, object]:
    return {
        "sglang_server_model_path": f"{MODELS}/target",
        "sglang_server_draft_model_path": f"{MODELS}/draft",
        "sglang_server_python": DEVICE_PYTHON,
        "sglang_server_tp_size": 1,
        "sglang_server_extra_args": EXTRA_ARGS,
        "sglang_server_config_dir": str(work / name),
        "sglang_server_unit_dir": str(work / "units"),
        "sglang_server_doctor_report": str(work / "no-doctor-report.json"),
        "ansible_python_interpreter": sys.executable,
        **overrides,
    }


def _write(path: Path, text: str) -> None:
    """Atomically, via a new temporary file beside it (never through a link planted at the name: it is replaced)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        Path(tmp).chmod(0o644)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def render_all(out: Path) -> list[Path]:
    """Every variant in one ansible-playbook run (one play each), copied into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="render-launch-") as tmp:
        work = Path(tmp)
        (work / "units").mkdir()
        plays = []
        for name, overrides in VARIANTS.items():
            (work / f"{name}.json").write_text(json.dumps(variables(name, overrides, work)), encoding="utf-8")
            plays.append(PLAY.format(vars_file=json.dumps(str(work / f"{name}.json"))))
        (work / "play.yml").write_text("".join(plays), encoding="utf-8")
        playbook = Path(sys.executable).parent / "ansible-playbook"
        cmd = [str(playbook), str(work / "play.yml"), "-i", "localhost,", "--tags", "sglang_server_configure,always"]
        env = {**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_NOCOLOR": "1"}
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600, check=False)
        if run.returncode != 0:
            raise SystemExit(f"ansible-playbook failed:\n{run.stdout[-3000:]}\n{run.stderr[-2000:]}")
        written = []
        for name in VARIANTS:
            text = (work / name / "launch-command.txt").read_text(encoding="utf-8")
            _write(out / f"{name}.txt", text)
            unit_env = (work / name / "environment").read_text(encoding="utf-8")
            _write(out / f"{name}.env", unit_env)
            written += [out / f"{name}.txt", out / f"{name}.env"]
        wait = (work / next(iter(VARIANTS)) / "wait.json").read_text(encoding="utf-8")
        _write(out / "wait.json", wait.strip() + "\n")
        written.append(out / "wait.json")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    try:
        written = render_all(args.out)
    except OSError as exc:  # --out is a file, or cannot be written
        print(f"render_launch: --out {args.out}: {exc.strerror or exc}; give a writable directory", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
