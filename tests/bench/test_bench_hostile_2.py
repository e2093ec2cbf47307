"""`bench` and `crossover` on the inputs of reliability probe 2 (N45, N46, N49, N51, N52, N55, N59, N60, B8, B13,
B15, X18): every file is bounded and a regular file, non-UTF-8 is named with its line and the fix, every numeric
option is finite and in range, a closed stdout is no traceback. Nothing here reaches a server: each case is refused
before the first request (the URL is a closed port)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from bench.conftest import run_subcommand
from sm120check import bounded
from sm120check.bench import prompts
from sm120check.bench.records import SCHEMA

CLOSED = "http://127.0.0.1:9"
UTF8_FIX = "convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`)"


def _bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = run_subcommand("bench", "--url", CLOSED, "--quiet", *argv)
    except SystemExit as exc:  # argparse: a usage error
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def _record(concurrency: int, throughput: float, **extra: object) -> str:
    row = {"schema": SCHEMA, "label": "x", "run_id": "r1", "concurrency": concurrency, "window_s": 10.0}
    row |= {"throughput_tok_s": throughput, "output_tokens": int(throughput * 10), "requests": 8, "errors": 0}
    return json.dumps({**row, **extra}) + "\n"


def _sweep(path: Path, ratio: float = 1.0, **extra: object) -> Path:
    path.write_text("".join(_record(c, 100.0 * c * ratio, **extra) for c in (1, 2, 4, 8)), encoding="utf-8")
    return path


# --- files: bounded, regular, UTF-8 ----------------------------------------------------------------------------------


def test_a_prompt_file_that_is_a_device_is_refused_before_it_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _bench(capsys, "--prompt-file", "/dev/zero")  # was 4.4 GB of memory after 4 s
    assert code == 2
    assert err == (
        "sm120check bench: --prompt-file /dev/zero: is a device, not a regular file; give a text file, one prompt "
        "per line\n"
    )


def test_a_prompt_file_with_a_latin1_byte_names_its_line_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "prompts.txt"
    path.write_bytes(b"first prompt\nthe caf\xe9 prompt\n")
    code, err = _bench(capsys, "--prompt-file", str(path))
    assert code == 2
    assert err == f"sm120check bench: --prompt-file {path}:2: not UTF-8 text (byte 0xe9 at column 8); {UTF8_FIX}\n"


def test_a_prompt_file_over_its_bound_is_refused_without_reading_past_it(tmp_path: Path) -> None:
    path = tmp_path / "prompts.txt"
    path.write_text("a prompt\n" * 200, encoding="utf-8")
    with pytest.raises(ValueError) as refused:
        prompts.load_prompt_file(path, max_bytes=1024)
    assert str(refused.value) == (
        f"--prompt-file {path}: larger than 1 KiB, the bound on this file, read into memory; use a subset of its lines"
    )


def test_crossover_refuses_a_device_and_names_a_non_utf8_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _sweep(tmp_path / "base.jsonl")
    assert run_subcommand("crossover", str(base), "/dev/zero") == 2  # was 5.3 GB after 4 s
    assert capsys.readouterr().err == (
        "sm120check crossover: cannot read /dev/zero: is a device, not a regular file; give the JSONL file "
        "`sm120check bench --out` wrote\n"
    )
    latin = tmp_path / "spec.jsonl"
    latin.write_bytes(_record(1, 100.0).encode() + b'{"label": "caf\xe9"}\n')
    assert run_subcommand("crossover", str(base), str(latin)) == 2  # was a UnicodeDecodeError traceback
    assert capsys.readouterr().err == (
        f"sm120check crossover: {latin}:2: not UTF-8 text (byte 0xe9 at column 15); {UTF8_FIX}\n"
    )


def test_crossover_into_a_closed_pipe_is_no_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    base, spec = _sweep(tmp_path / "base.jsonl"), _sweep(tmp_path / "spec.jsonl", 1.2)
    monkeypatch.setattr("sys.stdout", ClosedPipe())
    assert run_subcommand("crossover", str(base), str(spec)) == 0  # `| true`: the reader went away, no error
    assert capsys.readouterr().err == ""


def test_an_accept_length_no_drafter_reaches_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, spec = _sweep(tmp_path / "base.jsonl"), _sweep(tmp_path / "spec.jsonl", 1.2, accept_length=1e308)
    assert run_subcommand("crossover", str(base), str(spec)) == 2  # was tau = inf, c = inf ms
    assert capsys.readouterr().err == (
        f"sm120check crossover: {spec}:1: field 'accept_length' is 1e+308: accepted tokens per verify step are "
        "between 0 and 64 (the server reported a count that cannot be true); remove or fix the record\n"
    )


def test_the_bounded_reader_keeps_the_newest_bytes_and_refuses_what_is_not_a_file(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"old\n" * 10 + b"newest\n")
    assert bounded.read_tail(log, 11) == (b"old\nnewest\n", True)
    assert bounded.read_tail(log, 1 << 10) == (log.read_bytes(), False)
    with pytest.raises(bounded.Unreadable) as directory:
        bounded.read_bytes(tmp_path, 64)
    assert str(directory.value) == f"{tmp_path}: is a directory, not a regular file"
    with pytest.raises(bounded.Missing) as missing:
        bounded.read_bytes(tmp_path / "none", 64)
    assert str(missing.value) == f"{tmp_path / 'none'}: No such file or directory"


# --- numeric options: finite, in range -------------------------------------------------------------------------------

SECONDS = "a number of seconds more than 0 and at most 86400"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        # N51: a NaN level timeout ended every level at once with 0 requests, and the bench exited 0
        (["--level-timeout", "nan"], f"argument --level-timeout: 'nan' is not a finite number; give {SECONDS}"),
        (["--request-timeout", "inf"], f"argument --request-timeout: 'inf' is not a finite number; give {SECONDS}"),
        (["--info-timeout", "nan"], f"argument --info-timeout: 'nan' is not a finite number; give {SECONDS}"),
        (["--duration", "inf"], f"argument --duration: 'inf' is not a finite number; give {SECONDS}"),
        (["--level-timeout", "1e9"], f"argument --level-timeout: '1e9' is out of range; give {SECONDS}"),
        # N49: a rate of 1e-300 waited for --level-timeout
        (
            ["--request-rate", "1e-300"],
            "argument --request-rate: request rate '1e-300' is out of range; give a number of requests per second at "
            "least 0.01 and at most 1e+06, or inf (all at once) (e.g. 1,2,4,8)",
        ),
        # B8: "²".isdigit() is true, int("²") is not: "invalid parse_levels value"
        (
            ["--concurrency", "1,²"],
            "argument --concurrency: concurrency '²' is not a whole number; give a whole number from 1 to 4096 (each "
            "in-flight request holds one connection and one task here; measure higher loads with several clients) "
            "(e.g. 1,2,5,10)",
        ),
        (
            ["--warmup", "-1"],
            "argument --warmup: '-1' is out of range; give a whole number of requests from 0 to 65536",
        ),
    ],
)
def test_a_numeric_option_out_of_range_is_refused_naming_the_value_and_the_range(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _bench(capsys, *argv)
    assert code == 2
    assert err.rstrip("\n").endswith(f"error: {said}"), err


def test_inf_stays_a_rate_and_a_burstiness(capsys: pytest.CaptureFixture[str]) -> None:
    from sm120check.bench.cli import _burstiness, parse_rates

    assert parse_rates("1,inf") == [1.0, float("inf")] and _burstiness("inf") == float("inf")
    code, err = _bench(capsys, "--request-rate", "nan")
    assert code == 2 and "request rate 'nan' is not a finite number;" in err
