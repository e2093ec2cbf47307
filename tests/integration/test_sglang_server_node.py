"""roles/sglang_server rendered on a lab node (a container, no SGLang, no start): the adaptive speculation config is
read where SGLang reads it, on the node, and its largest candidate step sizes the launch written there."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from lab.playbook import playbook_argv, run_playbook, write_inventory
from lab.podman import node_exec, running_node

pytestmark = pytest.mark.container

PLAY = "- name: Render the SGLang launch\n  hosts: all\n  gather_facts: false\n  roles: [sglang_server]\n"
CONFIG = "/var/lib/sm120kit-lab/sglang-spec-adaptive.json"


def test_the_adaptive_config_is_read_on_the_node_not_on_the_controller(lab: str, tmp_path: Path) -> None:
    assert not Path(CONFIG).exists(), f"{CONFIG} exists on the controller: the test could not tell where it was read"
    (tmp_path / "play.yml").write_text(PLAY)
    variables = {
        "sglang_server_model_path": "/models/target",
        "sglang_server_draft_model_path": "/models/draft",
        "sglang_server_speculative_adaptive_config": CONFIG,
    }
    with running_node("sglang-server", lab) as node:
        inventory = write_inventory(tmp_path / "inventory", [node])
        argv = playbook_argv(tmp_path / "play.yml", inventory, variables, tags=["sglang_server_configure"])
        absent = run_playbook(argv, timeout=600)
        assert absent.rc != 0
        assert f"is not there on {node.name}" in " ".join(absent.output.split()), absent.tail()
        text = json.dumps({"1": {"candidate_steps": [1, 5]}, "8": {"candidate_steps": [0]}})
        write = 'mkdir -p "$(dirname "$1")" && printf %s "$2" > "$1"'
        assert node_exec(node, ["sh", "-c", write, "sh", CONFIG, text]).returncode == 0
        run = run_playbook(argv, timeout=600)
        assert run.rc == 0, run.tail()
        launch = node_exec(node, ["cat", "/etc/sm120kit/sglang-server/launch-command.txt"]).stdout
        argv_on_node = shlex.split(launch)
        assert argv_on_node[argv_on_node.index("--speculative-num-steps") + 1] == "5"
        assert argv_on_node[argv_on_node.index("--speculative-num-draft-tokens") + 1] == "6"
        assert f"--speculative-adaptive-config {CONFIG}" in launch
