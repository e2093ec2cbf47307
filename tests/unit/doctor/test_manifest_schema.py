"""The node manifest's contract (issue #15, item 3): manifest.schema.json, the strict reader, the template, the checks.

- Ansible itself renders roles/sm120check/templates/manifest.json.j2 (the role under `--tags sm120check_configure`,
  on localhost into a temporary directory) from the inventory defaults and from overridden role variables; both
  manifests validate with the real `jsonschema` package and with the doctor's own reader, and the overrides appear.
- Hostile manifests are refused by both, naming the field.
- docs/checks.md's table and the schema list the same fields, and mutating each field changes the named check's
  verdict (with the node probes replaced by stand-ins: no nvcc, GPU or torch here).
"""

from __future__ import annotations

import copy
import json
import os
import platform
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.stand_ins import nccl_stand_in_venv
from sm120check import __version__, manifest
from sm120check.doctor import child, facts, loader, nvrtc_api
from sm120check.doctor.catalogue import all_checks
from sm120check.doctor.cuda_env import env
from sm120check.doctor.cuda_toolkit import nvrtc as nvrtc_checks
from sm120check.doctor.cuda_toolkit import toolkit
from sm120check.doctor.gpu.nvml_info_payload import NvmlAnswer
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.nvml_api import Gpu, NvmlInfo
from sm120check.doctor.preflight import driver
from sm120check.doctor.python_stack import abi, stack, torch
from sm120check.doctor.python_stack.torch_info_payload import TorchInfo
from sm120check.doctor.sm120check import manifest as manifest_check

jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[3]
ANSIBLE = str(Path(sys.executable).parent / "ansible-playbook")
SCHEMA = json.loads((ROOT / "python/sm120check/src/sm120check/manifest.schema.json").read_text(encoding="utf-8"))
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)

ROLE_PLAY = """---
- name: Write the node manifest as the sm120check role does
  hosts: localhost
  connection: local
  gather_facts: true
  roles:
    - role: sm120check
"""


def _render(tmp: Path, overrides: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    stack_vars = yaml.safe_load((ROOT / "inventory/group_vars/all/stack.yml").read_text(encoding="utf-8"))
    venv = nccl_stand_in_venv(tmp)
    variables = {
        **stack_vars,
        "sm120kit_venv": str(venv),
        "sm120check_manifest_dir": str(tmp / "etc"),
        "ansible_python_interpreter": sys.executable,
        **overrides,
    }
    (tmp / "play.yml").write_text(ROLE_PLAY, encoding="utf-8")
    (tmp / "vars.json").write_text(json.dumps(variables), encoding="utf-8")
    run = subprocess.run(
        [ANSIBLE, str(tmp / "play.yml"), "-i", "localhost,", "-e", f"@{tmp / 'vars.json'}",
         "--tags", "sm120check_configure"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=300,
        env={**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_NOCOLOR": "1"},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-3000:]
    path = tmp / "etc/manifest.json"
    return json.loads(path.read_text(encoding="utf-8")), venv


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the manifest task chowns to root")


@pytest.fixture(scope="module")
def rendered_defaults(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, Path]:
    tmp = tmp_path_factory.mktemp("defaults")
    data, venv = _render(tmp, {})
    return data, venv, tmp / "etc/manifest.json"


OVERRIDES: dict[str, Any] = {
    "cuda_toolkit_home": "/opt/othercuda",
    "cuda_toolkit_method": "apt",
    "nccl_method": "apt",
    "python_stack_venv": "/opt/otherstack/venv",
    "sm120kit_profile": "full",
    "sm120kit_env_overrides": {"NCCL_DEBUG": "INFO", "NCCL_P2P_LEVEL": None},
}


@needs_root
def test_the_manifest_from_the_inventory_defaults_validates_with_jsonschema_and_the_reader(
    rendered_defaults: tuple[dict[str, Any], Path, Path],
) -> None:
    data, venv, path = rendered_defaults
    VALIDATOR.validate(data)
    m = manifest.load(path)
    stack_vars = yaml.safe_load((ROOT / "inventory/group_vars/all/stack.yml").read_text(encoding="utf-8"))
    assert m.cuda == manifest.CudaPins("13.0.1", "13.0.88", "13.0.88", "/opt/cuda", "/opt/cuda/lib64")
    (site,) = venv.glob("lib/python3*/site-packages")
    assert m.nccl == manifest.NcclPins(stack_vars["sm120kit_nccl_version"], str(site / "nvidia/nccl/lib"))
    assert m.venv == str(venv) and m.profile == "full" and m.sm120kit_version == __version__
    assert m.python_packages == stack_vars["sm120kit_profiles"]["full"]["python_packages"]
    assert m.env["CUDA_HOME"] == "/opt/cuda" and m.driver_min == stack_vars["sm120kit_driver_min"]


@needs_root
def test_overridden_role_variables_appear_in_the_manifest_it_does_not_lie(tmp_path: Path) -> None:
    data, _ = _render(tmp_path, OVERRIDES)
    VALIDATOR.validate(data)
    m = manifest.load(tmp_path / "etc/manifest.json")
    assert (m.cuda.home, m.cuda.lib_dir) == ("/opt/othercuda", "/opt/othercuda/lib64")
    multiarch = "aarch64" if platform.machine() == "aarch64" else "x86_64"
    assert m.nccl.lib_dir == f"/usr/lib/{multiarch}-linux-gnu"  # apt's libnccl2, not the wheel's directory
    assert m.venv == "/opt/otherstack/venv" and m.profile == "full" and "torch" in m.python_packages
    assert m.env["NCCL_DEBUG"] == "INFO" and "NCCL_P2P_LEVEL" not in m.env


def test_the_template_only_serializes_the_published_facts() -> None:
    """No `| default(...)` guess of another role's variable: every value comes from a role's publish.yml fact."""
    text = (ROOT / "roles/sm120check/templates/manifest.json.j2").read_text(encoding="utf-8")
    body = re.sub(r"\{#.*?#\}", "", text, flags=re.DOTALL)
    assert "default(" not in body
    names = set(re.findall(r":\s*([A-Za-z_][A-Za-z0-9_]*)", body))
    published = {"python_stack_resolved", "cuda_toolkit_resolved", "nccl_resolved", "cuda_env_resolved"}
    assert names <= published | {"_sm120check_version", "sm120kit_driver_min"}, names


# --- the schema file ships in the checker's wheel --------------------------------------------------------------------


def test_the_role_built_wheel_and_the_pyproject_ship_the_schema(tmp_path: Path) -> None:
    build = ROOT / "roles/sm120check/files/build_wheel.py"
    run = subprocess.run(
        [sys.executable, str(build), str(ROOT / "python/sm120check"), str(tmp_path)],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    with zipfile.ZipFile(run.stdout.strip().splitlines()[-1]) as wheel:
        assert json.loads(wheel.read("sm120check/manifest.schema.json")) == SCHEMA
    assert "manifest.schema.json" in (ROOT / "python/sm120check/pyproject.toml").read_text(encoding="utf-8")
    assert manifest.schema() == SCHEMA  # what the reader uses is the file itself


# --- hostile manifests: refused by both, the field named ---------------------------------------------------------


def good() -> dict[str, Any]:
    return {
        "schema": 2,
        "sm120kit_version": __version__,
        "profile": "core",
        "cuda": {
            "version": "13.0.1",
            "nvcc": "13.0.88",
            "nvrtc": "13.0.88",
            "home": "/opt/cuda",
            "lib_dir": "/opt/cuda/lib64",
        },
        "nccl": {"version": "2.30.7", "lib_dir": "/opt/sm120kit/venv/lib/python3.12/site-packages/nvidia/nccl/lib"},
        "driver_min": "580.65.06",
        "venv": sys.prefix,
        "python_packages": {"nvidia-ml-py": "13.580.82"},
        "env": {"CUDA_HOME": "/opt/cuda"},
    }


def _with(path: str, value: object) -> dict[str, Any]:
    data = good()
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node[part]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return data


DELETE = object()
HOSTILE = [
    ("cuda.version", 13, "cuda.version"),
    ("cuda.version", "13.0.1; rm -rf /", "cuda.version"),
    ("cuda.home", "opt/cuda", "cuda.home"),
    ("cuda.lib_dir", "", "cuda.lib_dir"),
    ("nccl.lib_dir", "/usr/lib\n/etc", "nccl.lib_dir"),
    ("nccl.lib_dir", DELETE, "nccl.lib_dir"),
    ("nccl.method", "wheels", '"method"'),  # schema 1's field: unknown now
    ("cuda.link", "/opt/cuda", '"link"'),
    ("extra", {"a": 1}, '"extra"'),
    ("venv", {"a": 1}, "venv"),
    ("venv", "relative/venv", "venv"),
    ("profile", None, "profile"),
    ("driver_min", "580", "driver_min"),
    ("python_packages", {"torch": ["2.14.1"]}, "python_packages.torch"),
    ("python_packages", {f"pkg{i}": "1.0" for i in range(600)}, "python_packages"),
    ("env", {"CUDA HOME": "/opt/cuda"}, "env"),
    ("env", {"HF_TOKEN": 12345}, "env.HF_TOKEN"),
    ("env", {"HF_TOKEN": "x" * 9000}, "env.HF_TOKEN"),
    ("env", "PATH=/bin", "env"),
    ("cuda", "x", "cuda"),
    ("nccl", [1, 2], "nccl"),
    ("sm120kit_version", True, "sm120kit_version"),
]


@pytest.mark.parametrize(("path", "value", "named"), HOSTILE, ids=[f"{p}={str(v)[:20]!r}" for p, v, _ in HOSTILE])
def test_a_hostile_manifest_is_refused_by_the_reader_and_by_jsonschema_naming_the_field(
    tmp_path: Path, path: str, value: object, named: str
) -> None:
    data = _with(path, value)
    assert not VALIDATOR.is_valid(data)
    target = tmp_path / "manifest.json"
    target.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(manifest.ManifestError) as caught:
        manifest.load(target)
    message = str(caught.value)
    assert caught.value.kind is manifest.ErrorKind.INVALID
    assert str(target) in message and named in message and "--tags sm120check" in message
    assert "x" * 100 not in message and "12345" not in message  # env values (maybe tokens) are never echoed


def test_the_good_manifest_is_accepted_by_both(tmp_path: Path) -> None:
    VALIDATOR.validate(good())
    target = tmp_path / "manifest.json"
    target.write_text(json.dumps(good()), encoding="utf-8")
    assert manifest.load(target).nccl.version == "2.30.7"


@pytest.mark.parametrize("schema", [1, 3, "2", None])
def test_another_schema_is_refused_with_its_kind_the_file_and_the_fix(tmp_path: Path, schema: object) -> None:
    target = tmp_path / "manifest.json"
    target.write_text(json.dumps({**good(), "schema": schema}), encoding="utf-8")
    with pytest.raises(manifest.ManifestError) as caught:
        manifest.load(target)
    assert caught.value.kind is manifest.ErrorKind.SCHEMA
    assert str(target) in str(caught.value) and "schema 2" in str(caught.value)
    assert "ansible-playbook site.yml --tags sm120check" in str(caught.value)


def test_a_missing_manifest_has_the_missing_kind_and_the_manifest_check_warns(tmp_path: Path) -> None:
    with pytest.raises(manifest.ManifestError) as caught:
        manifest.load(tmp_path / "absent.json")
    assert caught.value.kind is manifest.ErrorKind.MISSING
    check = manifest_check.ManifestCheck()
    missing = check.run(Context(manifest_error=str(caught.value), manifest_error_kind=caught.value.kind))
    # The kind decides, not the words: a message that happens to say "does not exist" but is invalid still fails.
    invalid = check.run(Context(manifest_error="x does not exist", manifest_error_kind=manifest.ErrorKind.INVALID))
    assert (missing.status, invalid.status) == (Status.WARN, Status.FAIL)


def test_the_reader_refuses_a_schema_keyword_it_does_not_implement(monkeypatch: pytest.MonkeyPatch) -> None:
    hacked = copy.deepcopy(SCHEMA)
    hacked["properties"]["venv"] = {"type": "string", "format": "uri"}
    monkeypatch.setattr(manifest, "schema", lambda: hacked)
    with pytest.raises(RuntimeError, match="format"):
        manifest.validate(good())


# --- docs/checks.md's table, the schema and the checks agree -------------------------------------------------------


def schema_fields() -> set[str]:
    """Top-level fields and the fields of the nested objects with fixed keys (cuda.*, nccl.*); `schema` is the
    reader's own."""
    fields: set[str] = set()
    for name, node in SCHEMA["properties"].items():
        if name == "schema":
            continue
        if node.get("type") == "object" and "properties" in node:
            fields |= {f"{name}.{sub}" for sub in node["properties"]}
        else:
            fields.add(name)
    return fields


def doc_table() -> dict[str, str]:
    text = (ROOT / "docs/checks.md").read_text(encoding="utf-8")
    section = text.split("## The node manifest", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_.]+)` \| `([a-z_0-9]+)` \|$", section, re.MULTILINE)
    assert rows, "docs/checks.md: no `manifest field | check` rows under ## The node manifest"
    table = dict(rows)
    assert len(table) == len(rows), "a field is listed twice"
    return table


def test_the_docs_table_lists_exactly_the_schema_fields_and_real_checks() -> None:
    from sm120check.doctor.catalogue import all_checks

    table = doc_table()
    assert set(table) == schema_fields()
    ids = {check.id for check in all_checks()}
    assert set(table.values()) <= ids


CHECK_MODULES = {"toolkit": toolkit, "nvrtc": nvrtc_checks, "abi_libs": abi, "torch": torch}


@pytest.mark.parametrize("field", sorted(f for f in schema_fields() if f.startswith(("cuda.", "nccl."))))
def test_only_the_named_check_reads_each_cuda_and_nccl_field(field: str) -> None:
    """The issue's bug: cuda.lib_dir read by two checks, nccl.lib_dir by none. Each is read by one check module."""
    pattern = re.compile(rf"\.{re.escape(field)}\b")
    readers = sorted(
        p.stem for p in {Path(sys.modules[type(c).__module__].__file__ or "") for c in all_checks()}
        if pattern.search(p.read_text(encoding="utf-8"))
    )  # fmt: skip
    owner = doc_table()[field]
    assert readers == [Path(CHECK_MODULES[owner].__file__ or "").stem]


# Mutation: each field changed alone changes the named check's verdict (status or summary). The probes of the node
# are stand-ins (named below); the comparison code is the real check's.

NVCC_VERSION = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n"


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A stand-in node: nvcc 13.0.88 at /opt/cuda, NVRTC 13.0 from /opt/cuda/lib64, torch 2.14.1 loading NCCL 2.30.7
    from the manifest's nccl dir, driver 580.95.05 with one RTX PRO 6000."""
    monkeypatch.setenv("CUDA_HOME", "/opt/cuda")

    def fake_run(cmd: list[str], timeout: float) -> tuple[int, str]:
        return (0, NVCC_VERSION) if "--version" in cmd else (0, "sm_100 sm_120 sm_121")

    monkeypatch.setattr(toolkit, "_run", fake_run)
    opened = nvrtc_api.Opened(path="/opt/cuda/lib64/libnvrtc.so.13", version=(13, 0), archs=(90, 100, 120))
    monkeypatch.setattr(nvrtc_api, "probe", lambda timeout, compile_for=(): nvrtc_api.ProbeAnswer(opened=opened))
    monkeypatch.setattr(loader, "same_file", lambda a, b: os.path.normpath(a) == os.path.normpath(b))
    monkeypatch.setattr(loader, "ldconfig_cache", lambda: {})
    real_installed = facts.distributions

    def installed(venv: Path) -> dict[str, str]:
        return {**real_installed(venv), "torch": "2.14.1"} if "torch" in os.environ.get("_STANDIN", "") else {}

    monkeypatch.setattr(facts, "distributions", installed)  # the stack venv's facts, read by Context()
    torch_info = TorchInfo(True, version="2.14.1", cuda="13.0", nccl="2.30.7", arch_list=("sm_120",)).to_json()
    gpu = Gpu(0, "NVIDIA RTX PRO 6000", (12, 0), True, "00000000:01:00.0")
    nvml = NvmlAnswer(NvmlInfo("580.95.05", 13000, (gpu,), "ctypes")).to_json()

    def run_probe(probe: str, *args: Any, **kwargs: Any) -> child.ChildOutcome:
        return child.ChildOutcome(ok=True, data=torch_info if probe == torch.PROBE else nvml)

    monkeypatch.setattr(child, "run_probe", run_probe)
    yield


def _run(check: Callable[[], Any], m: manifest.Manifest, results: dict[str, Result] | None = None) -> Result:
    result: Result = check().run(Context(manifest=m, results=results or {}))
    return result


def _mutations() -> list[tuple[str, Any]]:
    return [
        ("sm120kit_version", "0.0.1"),
        ("profile", "full"),
        ("cuda.version", "13.1.0"),
        ("cuda.nvcc", "13.0.99"),
        ("cuda.home", "/opt/othercuda"),
        ("cuda.nvrtc", "13.1.80"),
        ("cuda.lib_dir", "/opt/othercuda/lib64"),
        ("nccl.version", "2.28.3"),
        ("nccl.lib_dir", "/usr/lib/x86_64-linux-gnu"),
        ("driver_min", "590.10.01"),
        ("venv", "/nonexistent/venv"),
        ("python_packages", {"nvidia-ml-py": "0.0.1"}),
        ("env", {"SM120KIT_TEST_ONLY": "1"}),
    ]


def test_every_field_has_a_mutation_below() -> None:
    assert {field for field, _ in _mutations()} == schema_fields()


CHECK_CLASSES: dict[str, Callable[[], Any]] = {
    "manifest": manifest_check.ManifestCheck,
    "toolkit": toolkit.ToolkitCheck,
    "nvrtc": nvrtc_checks.NvrtcCheck,
    "abi_libs": abi.AbiLibsCheck,
    "torch": torch.TorchCheck,
    "driver": driver.DriverCheck,
    "stack": stack.StackCheck,
    "env": env.EnvCheck,
}


@pytest.mark.parametrize(("field", "value"), _mutations(), ids=[f for f, _ in _mutations()])
def test_changing_a_field_changes_the_verdict_of_its_check(
    node: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, value: Any
) -> None:
    owner = doc_table()[field]
    base = good()
    base["nccl"]["lib_dir"] = "/opt/stack/nvidia/nccl/lib"
    base["python_packages"] = {}
    base["env"] = {}
    if owner == "torch" and field != "profile":
        monkeypatch.setenv("_STANDIN", "torch")  # torch "installed" in the stand-in venv
    results = {}
    if owner == "abi_libs":  # what the torch check's process mapped
        maps = {"libnccl": ["/opt/stack/nvidia/nccl/lib/libnccl.so.2"]}
        results["torch"] = Result("torch", Status.PASS, "torch", data={"maps": maps})
    before = _load(tmp_path / "before.json", base)
    after = _load(tmp_path / "after.json", _set(base, field, value))
    check = CHECK_CLASSES[owner]
    old, new = _run(check, before, results), _run(check, after, results)
    assert (old.status, old.summary) != (new.status, new.summary), (owner, old, new)
    assert new.status in (Status.WARN, Status.FAIL), new  # the node no longer agrees with the manifest: said so


def _set(data: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    *parents, last = field.split(".")
    node = data
    for part in parents:
        node = node[part]
    node[last] = value
    return data


def _load(path: Path, data: dict[str, Any]) -> manifest.Manifest:
    VALIDATOR.validate(data)
    path.write_text(json.dumps(data), encoding="utf-8")
    return manifest.load(path)


def test_the_gpu_tests_manifest_is_one_the_checker_reads() -> None:
    """tests/gpu runs the doctor with this fixture on the device machine: a schema it no longer reads broke them."""
    from sm120check import manifest

    path = Path(__file__).resolve().parents[2] / "fixtures" / "doctor" / "h200-manifest.json"
    loaded = manifest.load(path)
    assert loaded.venv == "/opt/torch/.venv" and loaded.python_packages == {"torch": "2.11.0"}
