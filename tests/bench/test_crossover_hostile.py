"""`crossover` on hostile records and options (reliability probe item 15: X13, X14, X17, X19, X25, X26, X27, X28,
X31, X32): every bad record is exit 2 naming the file, line and field; output paths are checked before the
analysis is printed; --steps, --hysteresis are range-checked at parse time; policy files are not overwritten
without --force."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from bench.conftest import run_subcommand
from sm120check.bench.records import SCHEMA, LevelSummary, append_jsonl


def record(concurrency: int, throughput: float, label: str = "x", **extra: object) -> dict[str, object]:
    out: dict[str, object] = {
        "schema": SCHEMA,
        "label": label,
        "run_id": "r1",
        "concurrency": concurrency,
        "throughput_tok_s": throughput,
        "window_s": 10.0,
        "output_tokens": int(throughput * 10),
        "requests": 8,
        "errors": 0,
    }
    out.update(extra)
    return out


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def sweeps(tmp_path: Path, spec_extra: dict[str, object] | None = None) -> tuple[Path, Path]:
    """A base and a spec sweep whose ratio crosses 1 between C=10 and C=100."""
    base = write_lines(
        tmp_path / "base.jsonl", [json.dumps(record(c, t, "base")) for c, t in ((1, 90), (10, 500), (100, 900))]
    )
    spec_lines = [json.dumps(record(c, t, "spec", **(spec_extra or {}))) for c, t in ((1, 130), (10, 600), (100, 700))]
    return base, write_lines(tmp_path / "spec.jsonl", spec_lines)


def crossover(*argv: str) -> int:
    return run_subcommand("crossover", *argv)


# --- X13, X14, X32: the parse of a record is total ---


@pytest.mark.parametrize(
    ("field", "value"),
    [("window_s", "abc"), ("output_tokens", 1.5), ("requests", "many"), ("errors", -1), ("window_valid", "yes")],
)
def test_a_mistyped_field_is_exit_2_naming_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: object
) -> None:
    base, spec = sweeps(tmp_path)
    lines = base.read_text().splitlines()
    bad = json.loads(lines[1])
    bad[field] = value
    write_lines(base, [lines[0], json.dumps(bad), lines[2]])
    assert crossover(str(base), str(spec)) == 2
    err = capsys.readouterr().err
    assert f"{base}:2" in err and field in err and "Traceback" not in err


def test_deep_json_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, spec = sweeps(tmp_path)
    write_lines(base, ["[" * 200_000 + "]" * 200_000])
    assert crossover(str(base), str(spec)) == 2
    assert f"{base}:1" in capsys.readouterr().err


# --- X19: a throughput of 1e-300 does not divide by zero ---


def test_a_vanishing_throughput_is_no_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_lines(tmp_path / "base.jsonl", [json.dumps(record(c, t)) for c, t in ((1, 90), (10, 500), (100, 900))])
    spec = write_lines(tmp_path / "spec.jsonl", [json.dumps(record(c, 1e-300)) for c in (1, 10, 100)])
    assert crossover(str(base), str(spec)) == 0
    assert "no crossover" in capsys.readouterr().out


# --- X17: a negative accept length is refused, not turned into negative step costs ---


def test_a_negative_accept_length_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, spec = sweeps(tmp_path, {"accept_length": -3})
    assert crossover(str(base), str(spec)) == 2
    assert "accept_length" in capsys.readouterr().err


# --- X27, X28: option ranges ---


@pytest.mark.parametrize("argv", [["--steps", "-2"], ["--steps", "0"], ["--hysteresis", "2"], ["--hysteresis", "nan"]])
def test_out_of_range_options_are_refused_at_parse_time(tmp_path: Path, argv: list[str]) -> None:
    base, spec = sweeps(tmp_path)
    with pytest.raises(SystemExit) as exc:
        crossover(str(base), str(spec), *argv, "--write-policies", str(tmp_path / "pol"))
    assert exc.value.code == 2
    assert not (tmp_path / "pol").exists()


def test_steps_one_is_kept_as_one(tmp_path: Path) -> None:
    base, spec = sweeps(tmp_path)
    pol = str(tmp_path / "pol")
    assert crossover(str(base), str(spec), "--steps", "1", "--draft-model", "/m", "--write-policies", pol) == 0
    vllm = json.loads((tmp_path / "pol" / "vllm-speculative-config.json").read_text())
    assert vllm["num_speculative_tokens"] == 1
    assert all(row[2] >= 0 for row in vllm["num_speculative_tokens_per_batch_size"])


# --- X25, X26, X31: output paths are checked before the analysis is printed ---


def test_existing_policy_files_are_kept_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, spec = sweeps(tmp_path)
    out = tmp_path / "pol"
    out.mkdir()
    (out / "router-rule.json").write_text("mine\n")
    assert crossover(str(base), str(spec), "--steps", "3", "--write-policies", str(out)) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--force" in captured.err and "router-rule.json" in captured.err
    assert (out / "router-rule.json").read_text() == "mine\n"
    assert crossover(str(base), str(spec), "--steps", "3", "--write-policies", str(out), "--force") == 0
    assert json.loads((out / "router-rule.json").read_text())["crossover"] > 10
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # no temporary file left


def test_policies_onto_a_file_or_below_one_are_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, spec = sweeps(tmp_path)
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    for target in (blocker, blocker / "sub"):
        assert crossover(str(base), str(spec), "--write-policies", str(target)) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and str(target) in captured.err


def test_png_into_a_missing_directory_is_exit_2_before_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, spec = sweeps(tmp_path)
    png = tmp_path / "missing" / "plot.png"
    assert crossover(str(base), str(spec), "--png", str(png)) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and str(png.parent) in captured.err


# --- probe 3, defect 17 (XZ5-XZ7): --zero-step keeps its own warnings and refuses mixed servers ----------------------


def _zero_rows(path: Path, rows: list[tuple[int, float, dict[str, object]]]) -> Path:
    append_jsonl(
        path,
        [
            LevelSummary(c, t, 10.0, int(t * 10), 20, 0, "zero", "r1", accept_length=1.008, meta=meta)  # type: ignore[arg-type]
            for c, t, meta in rows
        ],
    )
    return path


def _policy_sweeps(tmp_path: Path, meta: dict[str, object] | None = None) -> tuple[Path, Path]:
    base, spec = tmp_path / "base.jsonl", tmp_path / "spec.jsonl"
    plain = {**meta, "server": {**meta["server"], "speculative": False}} if meta else {}  # type: ignore[dict-item]
    for path, label, points, said in (
        (base, "base", {1: 90.0, 10: 500.0}, plain),
        (spec, "spec", {1: 130.0, 10: 400.0}, meta or {}),
    ):
        rows = [LevelSummary(c, t, 10.0, int(t * 10), 20, 0, label, "r1", meta=said) for c, t in points.items()]
        append_jsonl(path, rows)
    return base, spec


ON = {"server": {"speculative": True, "model_path": "/models/m"}, "args": {"url": "http://127.0.0.1:30000"}}
OFF = {"server": {"speculative": False, "model_path": "/models/m"}, "args": {"url": "http://127.0.0.1:30000"}}


def test_zero_step_warnings_of_its_own_sweep_are_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, spec = _policy_sweeps(tmp_path)
    zero = _zero_rows(tmp_path / "zero.jsonl", [(1, 80.0, ON), (10, 460.0, ON), (10, 1e6, ON)])
    argv = ("--steps", "3", "--zero-step", str(zero))
    assert run_subcommand("crossover", str(base), str(spec), *argv) == 0  # was silent: the slot moved
    out = capsys.readouterr().out
    assert f"--zero-step: {zero}: run r1 has C=10 twice; the later one is used" in out


def test_zero_step_refuses_a_file_mixing_a_plain_servers_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, spec = _policy_sweeps(tmp_path)
    zero = _zero_rows(tmp_path / "zero.jsonl", [(1, 90.0, OFF), (2, 150.0, OFF), (10, 460.0, ON), (20, 700.0, ON)])
    argv = ("--steps", "3", "--zero-step", str(zero), "--write-policies", str(tmp_path / "pol"))
    assert run_subcommand("crossover", str(base), str(spec), *argv) == 2  # was accepted
    err = capsys.readouterr().err
    assert f"--zero-step {zero}: mixes a plain server's records (speculation off at C=1,2) with a speculative" in err
    assert not (tmp_path / "pol").exists()


def test_zero_step_refuses_a_sweep_of_another_server_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, spec = _policy_sweeps(tmp_path, ON)
    other = {"server": {"speculative": True, "model_path": "/models/other"}, "args": {"url": "http://10.0.0.9:30000"}}
    zero = _zero_rows(tmp_path / "zero.jsonl", [(1, 80.0, other), (10, 460.0, other)])
    assert run_subcommand("crossover", str(base), str(spec), "--steps", "3", "--zero-step", str(zero)) == 2
    assert capsys.readouterr().err == (
        f"sm120check crossover: --zero-step {zero}: measured on /models/other at http://10.0.0.9:30000, but {spec} on "
        "/models/m at http://127.0.0.1:30000: bench the same speculative server, held at 0 steps\n"
    )
    mixed = _zero_rows(tmp_path / "mixed.jsonl", [(1, 80.0, ON), (10, 460.0, other)])
    assert run_subcommand("crossover", str(base), str(spec), "--steps", "3", "--zero-step", str(mixed)) == 2
    assert "mixes sweeps of different servers (/models/m at http://127.0.0.1:30000; /models/other at" in (
        capsys.readouterr().err
    )


# --- probe 3 minor XZ11: the policy files are readable by the server's user, and never written through a link ---


def test_policy_files_get_the_umasks_mode_and_replace_a_planted_link(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, spec = _policy_sweeps(tmp_path)
    out = tmp_path / "pol"
    out.mkdir()
    victim = tmp_path / "victim.json"
    victim.write_text("ORIGINAL\n")
    (out / "router-rule.json").symlink_to(victim)
    old = os.umask(0o022)
    try:
        argv = ("--steps", "3", "--write-policies", str(out), "--force")
        assert run_subcommand("crossover", str(base), str(spec), *argv) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    assert victim.read_text() == "ORIGINAL\n" and not (out / "router-rule.json").is_symlink()
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert set(modes.values()) == {0o644}, modes  # were 0600: a server run as another user could not read them
