"""Doctor option and manifest edge cases, and report files under planted links (reliability probe items 11 and 16:
D53, D28, D29, D19, D11, D15, D10, D13, D18): every bad input is refused with the value or file named, or becomes
the `manifest` check's FAIL with a full run; never a traceback, never a bare codec error, never a PASS over nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from doctor_helpers import doctor, write_manifest

from sm120check import manifest

QUICK = ("--level", "1", "--select", "platform,manifest,abi_wheels,stack", "--json")


def results_of(stdout: str) -> dict[str, dict[str, object]]:
    return {r["id"]: r for r in json.loads(stdout)["results"]}


def manifest_with(tmp: Path, **fields: object) -> Path:
    path = write_manifest(tmp)
    data = json.loads(path.read_text(encoding="utf-8")) | fields
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# --- D28, D29: --timeout / --jit-timeout must be finite and positive, refused when the options are parsed ---------


@pytest.mark.parametrize("option", ["--timeout", "--jit-timeout"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "soon"])
def test_a_timeout_that_is_not_finite_and_positive_is_a_usage_error(option: str, value: str) -> None:
    run = doctor("--level", "1", "--select", "platform", f"{option}={value}")  # = : "-inf" is no option
    assert run.returncode == 2, run.stdout + run.stderr
    assert option in run.stderr and repr(value) in run.stderr
    assert "Traceback" not in run.stderr and run.stdout == ""


# --- D19, D13: a manifest that is not UTF-8 ----------------------------------------------------------------------


def test_a_non_utf8_manifest_from_the_environment_fails_the_manifest_check_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "manifest.json"
    bad.write_bytes(b'{"schema": 2, "profile": "\xff\xfe"}')
    run = doctor(*QUICK, env={manifest.ENV_VAR: str(bad)})
    assert run.returncode == 1, run.stderr
    results = results_of(run.stdout)
    assert results["manifest"]["status"] == "fail"
    assert str(bad) in str(results["manifest"]["details"]) and "UTF-8" in str(results["manifest"]["details"])
    assert results["platform"]["status"] == "pass"  # the other checks ran
    assert "codec" not in run.stderr and "Traceback" not in run.stderr


def test_a_non_utf8_manifest_given_with_the_option_is_a_usage_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "manifest.json"
    bad.write_bytes(b"\xff\xfe{}")
    run = doctor(*QUICK, "--manifest", str(bad))
    assert run.returncode == 2
    assert str(bad) in run.stderr and "not UTF-8" in run.stderr and "rerun the sm120check role" in run.stderr
    assert "Traceback" not in run.stderr


# --- D11: the manifest's venv does not exist -----------------------------------------------------------------------


def test_a_manifest_whose_venv_does_not_exist_fails_abi_wheels_and_stack_naming_it(tmp_path: Path) -> None:
    ghost = tmp_path / "no-such-venv"
    run = doctor(*QUICK, "--manifest", str(manifest_with(tmp_path, venv=str(ghost))))
    results = results_of(run.stdout)
    for check in ("abi_wheels", "stack"):
        assert results[check]["status"] == "fail", results[check]
        assert str(ghost) in str(results[check]["summary"]) and "does not exist" in str(results[check]["summary"])
        assert "among 0 distributions" not in str(results[check]["summary"])
    assert run.returncode == 1


# --- D15: deeply nested JSON -----------------------------------------------------------------------------------------


def test_a_deeply_nested_manifest_is_a_clear_error_not_a_recursion_error(tmp_path: Path) -> None:
    deep = tmp_path / "manifest.json"
    deep.write_text('{"schema": 2, "x": ' + "[" * 200_000 + "]" * 200_000 + "}", encoding="utf-8")
    run = doctor(*QUICK, "--manifest", str(deep))
    assert run.returncode == 2 and str(deep) in run.stderr and "nested deeper" in run.stderr
    assert "RecursionError" not in run.stderr and "Traceback" not in run.stderr
    run = doctor(*QUICK, env={manifest.ENV_VAR: str(deep)})
    results = results_of(run.stdout)
    assert results["manifest"]["status"] == "fail" and "nested deeper" in str(results["manifest"]["details"])


# --- D10: a field of the wrong shape is named ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"), [("cuda", "x"), ("nccl", [1, 2]), ("env", "PATH=/bin"), ("venv", {"a": 1}), ("profile", None)]
)
def test_a_field_of_the_wrong_shape_is_named(tmp_path: Path, field: str, value: object) -> None:
    path = manifest_with(tmp_path, **{field: value})
    with pytest.raises(manifest.ManifestError, match=f"field `{field}`"):
        manifest.load(path)
    run = doctor(*QUICK, "--manifest", str(path))
    assert run.returncode == 2 and f"field `{field}`" in run.stderr and "dictionary update" not in run.stderr


def test_a_missing_field_is_named(tmp_path: Path) -> None:
    path = write_manifest(tmp_path)
    data = json.loads(path.read_text(encoding="utf-8"))
    del data["driver_min"]
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(manifest.ManifestError, match="no `driver_min` field"):
        manifest.load(path)


# --- D18: an empty SM120KIT_MANIFEST means unset ---------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_manifest_variable_means_the_default_path(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(manifest.ENV_VAR, value)
    assert manifest.manifest_path() == manifest.DEFAULT_PATH


def test_an_empty_manifest_variable_is_not_read_as_the_current_directory(tmp_path: Path) -> None:
    run = doctor("--level", "1", "--select", "manifest", "--json", env={manifest.ENV_VAR: ""})
    details = str(results_of(run.stdout)["manifest"]["details"])
    assert not details.startswith(". ") and "Is a directory" not in details
    if not manifest.DEFAULT_PATH.exists():
        assert str(manifest.DEFAULT_PATH) in details


# --- D53: report files are never written through a link planted at a temporary name -------------------------------


def last_pid() -> int:
    try:
        return int(Path("/proc/sys/kernel/ns_last_pid").read_text(encoding="ascii"))
    except (OSError, ValueError):
        return os.getpid()


def test_links_planted_at_every_predictable_temporary_name_are_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("ORIGINAL\n", encoding="utf-8")
    out = tmp_path / "collector"
    out.mkdir()
    start = last_pid()
    for name in ("x.prom", "x.xml"):
        for pid in range(max(start - 50, 1), start + 2000):  # the pids the doctor's process may get
            for planted in (f".{name}.{pid}.tmp", f"{name}.{pid}.tmp", f"{name}.partial", f"{name}.tmp"):
                if not (out / planted).is_symlink():
                    (out / planted).symlink_to(victim)
    run = doctor(
        "--level", "1", "--select", "platform", "--prometheus", str(out / "x.prom"), "--junit", str(out / "x.xml")
    )
    assert run.returncode == 0, run.stderr
    assert victim.read_text(encoding="utf-8") == "ORIGINAL\n"
    for name in ("x.prom", "x.xml"):
        report = out / name
        assert not report.is_symlink() and report.is_file()
        assert "sm120check" in report.read_text(encoding="utf-8")


# --- probe 2, N91, N90: a FIFO as the manifest, duplicate keys ---------------------------------------------------

FIX = "rerun the sm120check role (`ansible-playbook site.yml --tags sm120check`) to rewrite it"


def test_a_fifo_as_the_manifest_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "manifest.json"
    os.mkfifo(fifo)
    with pytest.raises(manifest.ManifestError) as refused:
        manifest.load(fifo)
    assert str(refused.value) == f"{fifo}: is a FIFO (named pipe), not a regular file; {FIX}"
    assert refused.value.kind is manifest.ErrorKind.UNREADABLE
    run = doctor(*QUICK, env={manifest.ENV_VAR: str(fifo)}, timeout=60)  # hung until killed before
    assert run.returncode == 1, run.stderr
    assert results_of(run.stdout)["manifest"]["details"] == str(refused.value)


def test_a_manifest_key_given_twice_is_refused_naming_it(tmp_path: Path) -> None:
    path = write_manifest(tmp_path)
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace('"profile":', '"profile": "full", "profile":', 1), encoding="utf-8")
    with pytest.raises(manifest.ManifestError) as refused:
        manifest.load(path)  # the last one silently won
    assert str(refused.value) == f'{path} lists the key "profile" twice; {FIX}'
    assert refused.value.kind is manifest.ErrorKind.INVALID
