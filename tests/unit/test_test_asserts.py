"""scripts/test_asserts.py (part of `make lint`): which tests it lists as checking nothing, on small trees of tests."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test_asserts.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("test_asserts_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


test_asserts = _script()


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def listed(root: Path, allowed: dict[str, str] | None = None) -> list[str]:
    return [f.key for f in test_asserts.find_unchecked(root, allowed or {})]


def test_a_test_without_an_assert_is_listed_with_its_file_and_line(tmp_path: Path) -> None:
    write(tmp_path, {"unit/test_a.py": "def helper():\n    return 1\n\n\ndef test_quiet():\n    helper()\n"})
    (found,) = test_asserts.find_unchecked(tmp_path, {})
    assert (found.path, found.line, found.name) == ("unit/test_a.py", 5, "test_quiet")
    assert found.key == "unit/test_a.py::test_quiet"


def test_a_test_calling_an_asserting_helper_is_not_listed(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "lab/__init__.py": "",
            "lab/checks.py": "def must(x):\n    assert x\n\n\ndef via(x):\n    must(x)\n",
            "unit/unit_helpers.py": "def fails(why):\n    raise AssertionError(why)\n",
            "unit/test_b.py": """
                import unit_helpers
                from lab.checks import via

                def local(x):
                    assert x == 1

                def test_same_module():
                    local(1)

                def test_imported_transitively():
                    via(True)

                def test_module_attribute():
                    unit_helpers.fails("no")

                class TestGroup:
                    def check(self):
                        assert True

                    def test_method_on_self(self):
                        self.check()
            """,
        },
    )
    assert listed(tmp_path) == []


def test_a_helper_that_asserts_nothing_does_not_count(tmp_path: Path) -> None:
    write(tmp_path, {"test_c.py": "def setup_only():\n    return 2\n\n\ndef test_x():\n    setup_only()\n"})
    assert listed(tmp_path) == ["test_c.py::test_x"]


@pytest.mark.parametrize(
    "body",
    [
        "with pytest.raises(ValueError):\n        int('x')",
        "pytest.raises(ValueError, int, 'x')",
        "pytest.fail('always')",
        "with pytest.warns(UserWarning):\n        warn()",
    ],
)
def test_a_test_with_pytest_raises_fail_or_warns_is_not_listed(tmp_path: Path, body: str) -> None:
    write(tmp_path, {"test_d.py": f"import pytest\n\n\ndef test_it():\n    {body}\n"})
    assert listed(tmp_path) == []


def test_an_allow_listed_test_is_not_listed_and_a_stale_entry_is_reported(tmp_path: Path) -> None:
    write(tmp_path, {"test_e.py": "def test_smoke():\n    print('hi')\n\n\ndef test_other():\n    assert 1\n"})
    allowed = {"test_e.py::test_smoke": "the reason", "test_e.py::test_other": "asserts now"}
    assert listed(tmp_path, allowed) == []
    assert test_asserts.stale_allowances(tmp_path, allowed) == ["test_e.py::test_other"]


def test_the_script_exits_1_naming_the_test_and_0_on_a_clean_tree(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad", {"test_f.py": "def test_nothing():\n    pass\n"})
    run = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True, check=False)
    assert run.returncode == 1
    assert f"{bad / 'test_f.py'}:1: test_nothing checks nothing" in run.stdout
    good = write(tmp_path / "good", {"test_g.py": "def test_something():\n    assert 2 > 1\n"})
    run = subprocess.run([sys.executable, str(SCRIPT), str(good)], capture_output=True, text=True, check=False)
    assert (run.returncode, run.stdout) == (0, "")


def test_this_repositorys_tests_all_check_something() -> None:
    """What `make lint` runs: every test under tests/ checks something or is allowed with a reason."""
    assert test_asserts.find_unchecked(SCRIPT.parents[1] / "tests") == []
    assert test_asserts.stale_allowances(SCRIPT.parents[1] / "tests") == []
    assert all(reason.strip() for reason in test_asserts.ALLOWED.values())
