"""One typed doctor report (doctor/document.py `DoctorReport`) for every reader: the fleet loader reads it strictly,
the Jinja node summary (playbooks/templates/node-summary.j2) and the sglang_server role's verdicts read its JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

from lab.playbook import REPO_ROOT, run_playbook
from sm120check.doctor import document
from sm120check.doctor.model import Result, Status
from sm120check.doctor.payload import PayloadError
from sm120check.fleet.load import node_from_document
from sm120check.fleet.model import NodeState

FIXTURES = Path(__file__).parent / "fixtures"
SRC = REPO_ROOT / "python" / "sm120check" / "src"


@pytest.fixture(scope="module")
def real_report() -> dict[str, object]:
    """`sm120check doctor --level 1 --json` run for real on this machine."""
    run = subprocess.run(
        [sys.executable, "-m", "sm120check.doctor", "--level", "1", "--json"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(SRC)),
        timeout=120,
        check=False,
    )
    assert run.returncode in (0, 1), run.stderr
    data: dict[str, object] = json.loads(run.stdout)
    return data


def test_the_doctors_json_and_recorded_fleet_reports_are_one_type(real_report: dict[str, object]) -> None:
    recorded = [FIXTURES / "vm-level2.json", *sorted((FIXTURES / "run-broken" / "nodes").glob("*-[0-9].json"))]
    for data in [real_report, *(json.loads(p.read_text()) for p in recorded)]:
        assert document.DoctorReport.from_json(data).to_json() == data


def test_the_fleet_loader_reads_the_doctors_report_type(real_report: dict[str, object]) -> None:
    typed = document.DoctorReport.from_json(real_report)
    node = node_from_document("here", real_report)
    assert node.state in (NodeState.READY, NodeState.FAILED), node.error
    assert [(r.id, r.status) for r in node.results] == [(r.id, r.status.value) for r in typed.results]
    assert (node.version, node.level, node.seconds) == (typed.version, typed.level, typed.seconds)


def test_a_bad_field_is_named_by_the_reader_and_the_fleet() -> None:
    data = json.loads((FIXTURES / "vm-level2.json").read_text())
    data["results"][2]["level"] = "2"
    with pytest.raises(PayloadError) as caught:
        document.DoctorReport.from_json(data)
    assert caught.value.field == "results[2].level"
    node = node_from_document("odd", data)
    assert node.state is NodeState.ERROR and "results[2].level: expected an integer" in node.error


def test_the_node_summary_template_renders_a_real_doctor_report(real_report: dict[str, object]) -> None:
    typed = document.DoctorReport.from_json(real_report)
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)  # the template lookup's settings
    template = env.from_string((REPO_ROOT / "playbooks" / "templates" / "node-summary.j2").read_text())
    text = template.render(
        inventory_hostname="here",
        sm120kit_profile="core",
        sm120kit_cuda_version="13.0.1",
        sm120kit_cuda_home="/opt/cuda",
        sm120kit_venv=sys.prefix,
        preflight_gpus=[],
        preflight_driver_version="",
        _report=real_report,
    )
    lines = text.splitlines()
    for result in typed.results:
        assert any(line.split()[:2] == [result.status.value.upper(), result.id] for line in lines), result.id
    tally = typed.summary
    assert lines[-1] == (
        f"doctor: {tally['pass']} pass, {tally['warn']} warn, {tally['fail']} fail, {tally['skip']} skip"
    )


def test_the_sglang_server_role_reads_the_verdicts_of_a_written_report(tmp_path: Path) -> None:
    results = [
        Result("allreduce_fusion", Status.PASS, "fused", family="comm", level=3),
        Result("symm_mem", Status.PASS, "symm", family="comm", level=3),
        Result(
            "sglang_comm",
            Status.FAIL,
            "SGLang at launch: symmetric memory OFF",
            family="sglang",
            level=3,
            data={"allreduce_fusion": "on", "symmetric_memory": "off"},
        ),
    ]
    report = document.build(
        results, version="0.1.0", host="here", started="2026-12-01T00:00:00+00:00", seconds=1.0, level=3, manifest=""
    )
    path = tmp_path / "doctor.json"
    path.write_text(json.dumps(report.to_json()), encoding="utf-8")
    out = tmp_path / "choice.json"
    playbook = tmp_path / "verdicts.yml"
    role = REPO_ROOT / "roles" / "sglang_server"
    playbook.write_text(
        json.dumps(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "vars_files": [str(role / "vars" / "main.yml")],
                    "vars": {
                        "sglang_server_doctor_report": str(path),
                        "sglang_server_allreduce_fusion": "auto",
                        "sglang_server_symm_mem": "auto",
                        "sglang_server_custom_all_reduce": "auto",
                        # what the PCIe-IPC choice in verdicts.yml reads (the role's defaults)
                        "sglang_server_pcie_ipc_allreduce": "auto",
                        "sglang_server_pcie_ipc_max_bs": None,
                        "sglang_server_hidden_size": None,
                        "sglang_server_max_running_requests": None,
                        "sglang_server_speculative": True,
                        "sglang_server_speculative_num_draft_tokens": 4,
                        "sglang_server_tp_size": 8,
                        "sglang_server_extra_args": [],
                    },
                    "tasks": [
                        {"ansible.builtin.import_tasks": str(role / "tasks" / "verdicts.yml")},
                        {
                            "ansible.builtin.copy": {
                                "dest": str(out),
                                "content": "{{ {'fusion': _sglang_server_fusion_on | bool, "
                                "'symm': _sglang_server_symm_on | bool} | to_json }}",
                            }
                        },
                    ],
                }
            ]
        ),
        encoding="utf-8",
    )
    argv = ["ansible-playbook", "-i", "localhost,", "-c", "local", str(playbook)]
    run = run_playbook([*argv, "-e", f"ansible_python_interpreter={sys.executable}"], timeout=300)
    assert run.rc == 0, run.tail()
    # allreduce_fusion passed and SGLang runs it fused; symm_mem passed but SGLang itself turns it off.
    assert json.loads(out.read_text()) == {"fusion": True, "symm": False}
