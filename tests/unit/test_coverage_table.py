"""scripts/coverage_table.py: the real tree's table is current and every record has a valid header; bad headers and
checks the map does not know are named."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "coverage_table.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("coverage_table", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["coverage_table"] = module
    spec.loader.exec_module(module)
    return module


ct = _load()

GOOD = """---
date: 2026-12-01T17:59Z
commit: 005d918
machine: 1x H200
gpus: 1x NVIDIA H200
interconnect: none (one GPU)
commands:
  - python3 -m sm120check doctor --level 2 --json
result: every check gave its verdict
pytest: not run
checks:
  - driver: pass: NVML listed the GPU
  - topology: skip: needs at least 2 GPUs
  - scripts/device/node-health.sh: ran @dd2880b: probe and verdicts
---

# a record
"""
ROWS = ("driver", "topology", "scripts/device/node-health.sh")


def test_the_committed_table_is_current_and_every_record_has_a_header() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr


def test_a_good_header_parses_with_its_entries() -> None:
    header = ct.parse_header(GOOD, "r/README.md", ROWS)
    assert header.machine == "1x H200"
    assert header.date.isoformat() == "2026-12-01T17:59:00+00:00"
    assert [(e.row, e.outcome, e.commit) for e in header.checks] == [
        ("driver", "pass", "005d918"),
        ("topology", "skip", "005d918"),
        ("scripts/device/node-health.sh", "ran", "dd2880b"),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("# no header\n", "r/README.md: no header"),
        (GOOD.replace("pytest: not run\n", ""), "r/README.md: header field 'pytest' missing"),
        (GOOD.replace("2026-12-01T17:59Z", "2026-12-01 17:59"), "r/README.md: header field 'date'"),
        (GOOD.replace("2026-12-01T17:59Z", "2026-13-01T17:59Z"), "r/README.md: header field 'date'"),
        (GOOD.replace("machine: 1x H200", "machine: 8x RTX"), "r/README.md: header field 'machine'"),
        (GOOD.replace("commit: 005d918", "commit: HEAD"), "r/README.md: header field 'commit'"),
        (GOOD.replace("  - driver: pass:", "  - drivr: pass:"), "'drivr' is not a GPU check or GPU script"),
        (GOOD.replace("  - driver: pass:", "  - driver: great:"), "outcome 'great'"),
        (GOOD.replace("result:", "owner: me\nresult:"), "unknown field 'owner'"),
    ],
)
def test_a_bad_header_is_named_with_its_file_and_field(text: str, message: str) -> None:
    with pytest.raises(ct.CoverageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ct.parse_header(text, "r/README.md", ROWS)


def test_a_date_later_than_the_commit_that_records_it_is_refused() -> None:
    record = "docs/validation/2026-12-01-h200-doctor-facts/README.md"
    text = (ROOT / record).read_text(encoding="utf-8").replace("date: 2026-12-01T14:13Z", "date: 2099-12-01T14:15Z")
    header = ct.parse_header(text, record, [*ct.GPU_CHECKS, *ct.GPU_SCRIPTS])
    with pytest.raises(ct.CoverageError, match="is later than the commit that records it"):
        ct.check_dates(ROOT, header)


def test_a_check_the_map_does_not_know_is_an_error() -> None:
    catalogue = [*ct.catalogue(), ("gpu_new_probe", 2)]
    with pytest.raises(ct.CoverageError, match="gpu_new_probe in neither GPU_CHECKS nor CPU_CHECKS"):
        ct.gpu_check_rows(catalogue)


def test_every_doctor_check_is_in_one_map() -> None:
    rows = ct.gpu_check_rows(ct.catalogue())
    assert {cid for cid, _ in rows} == set(ct.GPU_CHECKS)


def test_a_record_readme_that_is_not_utf8_is_named_with_its_line_and_the_fix(tmp_path: Path) -> None:
    record = tmp_path / ct.VALIDATION / "2026-12-01-latin"
    record.mkdir(parents=True)
    (record / "README.md").write_bytes(GOOD.encode() + b"caf\xe9\n")  # was a UnicodeDecodeError traceback
    with pytest.raises(ct.CoverageError) as refused:
        ct.read_records(tmp_path, ROWS)
    line = GOOD.count("\n") + 1
    assert str(refused.value) == (
        f"{ct.VALIDATION}/2026-12-01-latin/README.md:{line}: not UTF-8 text (byte 0xe9); convert the file to UTF-8 "
        "(e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`)"
    )
