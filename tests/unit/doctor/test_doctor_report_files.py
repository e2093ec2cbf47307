"""The doctor's report files under faults (reliability probe item 9: D22-D25, D49-D52): --junit and --prometheus
are written first and atomically, whatever happens to stdout (a reader gone, stdout closed, a full device); probe
output with ANSI codes or NUL still makes well-formed XML; an unusable output path is refused before any check
runs, naming the path, and leaves nothing behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from sm120check.cli import main
from sm120check.doctor import report
from sm120check.doctor.model import Result, Status

# One quick level-1 check: the run takes well under a second, and the files have something in them.
DOCTOR = [sys.executable, "-m", "sm120check", "doctor", "--level", "1", "--select", "platform"]
INFO = report.RunInfo("node1", "0.1.0", "2026-11-30T12:00:00+00:00", 1.5, 2, "", 1796040000.0)
HOSTILE = "\x1b[31mCUDA error\x1b[0m \x00 bell\x07 \x1b]0;title\x07 del\x7f \ufffe"

# The Prometheus text exposition format, line by line (what node_exporter's textfile collector accepts).
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_VALUE = r'"(?:[^"\\\n]|\\["\\n])*"'
_SAMPLE = re.compile(
    rf"^{_NAME}(?:\{{(?:[a-zA-Z_][a-zA-Z0-9_]*={_LABEL_VALUE})(?:,[a-zA-Z_][a-zA-Z0-9_]*={_LABEL_VALUE})*\}})?"
    r" [-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|NaN|Inf)(?: -?[0-9]+)?$"
)
_META = re.compile(rf"^# (?:HELP {_NAME} .*|TYPE {_NAME} (?:counter|gauge|histogram|summary|untyped))$")


def assert_prometheus_text(text: str) -> None:
    assert text.endswith("\n")
    for line in text.splitlines():
        assert _SAMPLE.match(line) or _META.match(line), f"not exposition format: {line!r}"
    parser = pytest.importorskip("prometheus_client.parser")
    families = list(parser.text_string_to_metric_families(text))
    assert {f.name for f in families} >= {"sm120check_check_status", "sm120check_checks"}


def assert_report_files(junit: Path, prom: Path) -> None:
    assert junit.is_file() and prom.is_file()
    root = ET.fromstring(junit.read_bytes())
    assert root.tag == "testsuites" and root.find(".//testcase[@name='platform']") is not None
    assert_prometheus_text(prom.read_text(encoding="utf-8"))
    assert not [p.name for p in junit.parent.iterdir() if p.name.startswith(".")]  # no temporary left


# --- D49-D51: stdout gone, closed or full; the files are written anyway, no traceback ---


def test_report_files_survive_a_reader_that_is_gone(tmp_path: Path) -> None:
    junit, prom = tmp_path / "j.xml", tmp_path / "p.prom"
    read_end, write_end = os.pipe()
    os.close(read_end)  # `doctor ... | true` once `true` has exited: every write to stdout is EPIPE
    try:
        done = subprocess.run(
            [*DOCTOR, "--junit", str(junit), "--prometheus", str(prom)],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr  # the verdict (platform passes here), not a crash
    assert_report_files(junit, prom)


def test_report_files_survive_a_closed_stdout(tmp_path: Path) -> None:
    junit, prom = tmp_path / "j.xml", tmp_path / "p.prom"
    done = subprocess.run(
        [*DOCTOR, "--junit", str(junit), "--prometheus", str(prom)],
        stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120, check=False,
        preexec_fn=lambda: os.close(1),  # `doctor ... >&-`
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert "stdout is closed" in done.stderr
    assert_report_files(junit, prom)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_report_files_survive_a_full_stdout(tmp_path: Path) -> None:
    junit, prom = tmp_path / "j.xml", tmp_path / "p.prom"
    with Path("/dev/full").open("w") as full:
        done = subprocess.run(
            [*DOCTOR, "--junit", str(junit), "--prometheus", str(prom)],
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert "cannot write to stdout" in done.stderr
    assert_report_files(junit, prom)


# --- D52: ANSI codes and NUL in a probe's output; the JUnit file is still XML ---


def test_junit_with_ansi_and_control_characters_is_well_formed() -> None:
    results = [
        Result(f"check_{status.value}", status, f"summary {HOSTILE}", details=f"details {HOSTILE}", remedy=HOSTILE)
        for status in Status
    ]
    results.append(Result(f"id{HOSTILE}", Status.FAIL, "x", family=HOSTILE))
    text = report.to_junit(results, INFO)
    root = ET.fromstring(text.encode("utf-8"))  # the program's own parser: raises on a forbidden character
    failure = root.find(".//testcase[@name='check_fail']/failure")
    assert failure is not None
    assert failure.get("message") == "summary CUDA error \\x00 bell\\x07  del\x7f \\ufffe"
    assert "\x1b" not in text and "[31m" not in text
    assert_prometheus_text(report.to_prometheus(results, INFO))


def test_a_probe_that_prints_colours_and_nul_gives_a_well_formed_junit(tmp_path: Path) -> None:
    # the probe's reproduction: a torch whose import writes a coloured error with a NUL and exits 3
    site = tmp_path / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(
        'import sys; sys.stderr.write("\\x1b[31mCUDA error\\x1b[0m \\x00\\n"); raise SystemExit(3)\n', encoding="utf-8"
    )
    (site / "torch-2.14.1.dist-info").mkdir()
    (site / "torch-2.14.1.dist-info" / "METADATA").write_text("Name: torch\nVersion: 2.14.1\n", encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    junit = tmp_path / "j.xml"
    cmd = [sys.executable, "-m", "sm120check", "doctor", "--level", "2", "--select", "torch", "--junit", str(junit)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode in (0, 1), done.stderr
    root = ET.fromstring(junit.read_bytes())
    assert root.find(".//testcase[@name='torch']") is not None


# --- D22-D25: unusable output paths are refused before any check runs, naming the path ---


@pytest.mark.parametrize("option", ["--junit", "--prometheus"])
@pytest.mark.parametrize("kind", ["missing-directory", "a-directory", "parent-is-a-file"])
def test_an_unusable_output_path_is_refused_before_the_checks(
    option: str, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if kind == "missing-directory":
        target = tmp_path / "missing" / "out.file"
    elif kind == "a-directory":
        target = tmp_path / "out.file"
        target.mkdir()
    else:
        (tmp_path / "plain").write_text("", encoding="utf-8")
        target = tmp_path / "plain" / "out.file"
    ran: list[object] = []

    def run(*a: object, **k: object) -> list[object]:
        ran.append(a)
        return []

    monkeypatch.setattr("sm120check.doctor.runner.run", run)
    code = main(["doctor", "--level", "1", "--select", "platform", option, str(target)])
    err = capsys.readouterr().err
    assert code == 2
    assert ran == []  # refused before any check ran
    assert str(target) in err and ".tmp" not in err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # nothing left behind


def test_a_failed_write_leaves_no_temporary_and_names_the_path(tmp_path: Path) -> None:
    target = tmp_path / "p.prom"
    target.mkdir()  # the rename onto a directory fails after the temporary was written
    with pytest.raises(OSError) as caught:
        report.write_file(target, "x 1\n")
    assert caught.value.filename == str(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.prom"]


def test_write_file_replaces_atomically_and_is_readable(tmp_path: Path) -> None:
    target = tmp_path / "p.prom"
    target.write_text("old 1\n", encoding="utf-8")
    report.write_file(target, "new 1\n")
    assert target.read_text(encoding="utf-8") == "new 1\n"
    assert target.stat().st_mode & 0o444 == 0o444  # node_exporter runs as another user
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.prom"]
