"""One schema for the pcie_p2p fact file (doctor/pcie/pcie_p2p.schema.json): the doctor's reader validates with it
(strict_schema.py) and the `jsonschema` package agrees with that reader on good and hostile files; the package ships
it. tests/ansible/test_pcie_role_fact_file.py checks the role's own files against the same schema.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from sm120check import strict_schema
from sm120check.doctor.pcie import fact_file

jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((ROOT / "python/sm120check/src/sm120check/doctor/pcie/pcie_p2p.schema.json").read_text("utf-8"))
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
GOOD = {
    "schema": 1,
    "reboot_required": True,
    "changes": [
        "kernel parameters iommu=pt are in /etc/default/grub.d/99-sm120kit-pcie.cfg and take effect at the next boot"
    ],
    "kernel_params": ["iommu=pt"],
    "acs_bridges": ["0000:00:01.1", "0000:02:00.0"],
    "written_at": "2026-12-01T23:00:00Z",
}  # the example of docs/pcie.md


def with_field(name: str, value: object) -> dict[str, object]:
    doc: dict[str, object] = copy.deepcopy(GOOD)
    doc[name] = value
    return doc


HOSTILE = [
    with_field("schema", 2),
    with_field("schema", "1"),
    with_field("reboot_required", 1),
    with_field("changes", {"a": 1}),
    with_field("changes", ["x" * 513]),
    with_field("kernel_params", ["iommu=pt; reboot"]),
    with_field("acs_bridges", ["0000:40:01.1"] * 257),
    with_field("acs_bridges", ["../../etc"]),
    with_field("written_at", "2026-12-01"),
    with_field("extra", True),
    {k: v for k, v in GOOD.items() if k != "changes"},
    [GOOD],
]


def test_the_reader_validates_with_the_shipped_schema_file() -> None:
    assert fact_file.schema() == SCHEMA
    assert "doctor/pcie/pcie_p2p.schema.json" in (ROOT / "python/sm120check/pyproject.toml").read_text("utf-8")
    assert sorted(SCHEMA["required"]) == sorted(fact_file.KEYS) == sorted(SCHEMA["properties"])


def test_the_documented_example_is_valid_for_both() -> None:
    assert list(VALIDATOR.iter_errors(GOOD)) == []
    fact_file.validate(GOOD)
    assert fact_file.PcieP2pFact.from_json(GOOD).to_json() == GOOD


@pytest.mark.parametrize("document", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_fact_file_is_refused_by_jsonschema_and_the_reader_alike(document: object) -> None:
    assert list(VALIDATOR.iter_errors(document)) != []
    with pytest.raises(fact_file.FactError):
        fact_file.validate(document)


def test_a_schema_keyword_the_reader_does_not_implement_is_an_error() -> None:
    hacked = copy.deepcopy(SCHEMA)
    hacked["properties"]["written_at"]["format"] = "date-time"
    with pytest.raises(RuntimeError, match="format"):
        strict_schema.validate(strict_schema.Schema("hacked.json", 1, hacked), GOOD)


def test_a_fact_file_with_a_5000_digit_integer_is_unusable_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "pcie_p2p.json"
    path.write_text('{"schema": ' + "9" * 5000 + "}", encoding="utf-8")  # was a ValueError traceback in two checks
    read = fact_file.read(path)
    assert read.fact is None and read.error.startswith(f"{path}: not JSON (Exceeds the limit")


def test_a_fact_file_with_a_key_twice_is_unusable(tmp_path: Path) -> None:
    path = tmp_path / "pcie_p2p.json"
    text = json.dumps(GOOD)
    path.write_text(text[:-1] + ', "schema": 99}', encoding="utf-8")  # was accepted, the later value winning (PC6)
    read = fact_file.read(path)
    assert read.fact is None and read.error == f'{path}: key "schema" appears twice; rerun the pcie_p2p role'
