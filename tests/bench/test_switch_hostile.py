"""Probe round 3's second half: the surfaces added with the speculation switch (crossover --more-spec and
--sglang-source, bench --server-log, verify-launch --plain-decode-min-bs, the switch's log line) fed hostile input.
Each is a clear error naming the value and the fix (exit 2), nothing written, no traceback, bounded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lab.sglang_releases import release_dir, run_cli
from sm120check.bench import tiers
from sm120check.cli import main
from sm120check.sglang import plain_decode

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bench"
BASE = FIXTURES / "h200-sglang-0.5.16-run2-base.jsonl"
SPEC = FIXTURES / "h200-sglang-0.5.16-run2-spec.jsonl"


def _crossover(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    status = main(["crossover", str(BASE), str(SPEC), *extra])
    return status, capsys.readouterr().err


def test_more_spec_a_fifo_is_refused_not_waited_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "sweep.jsonl"
    os.mkfifo(fifo)
    status, err = _crossover(capsys, "--more-spec", str(fifo), "--sglang-source", str(tmp_path))
    assert status == 2 and str(fifo) in err and "Traceback" not in err


def test_more_spec_the_same_depth_twice_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, err = _crossover(capsys, "--more-spec", str(SPEC), "--sglang-source", str(release_dir("0.5.23")))
    assert status == 2 and "both measure 3 steps" in err


@pytest.mark.parametrize("where", ["missing", "file"])
def test_sglang_source_that_is_no_tree_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    source = tmp_path / where
    if where == "file":
        source.write_text("not a tree")
    out = tmp_path / "pol"
    status, err = _crossover(capsys, "--sglang-source", str(source), "--write-policies", str(out), "--no-png")
    assert status == 2 and f"--sglang-source {source}: no SGLang package there" in err and "Traceback" not in err
    assert not (out / tiers.TIERS_FILE).exists()


def test_sglang_source_with_a_fifo_for_the_worker_is_no_switch_and_no_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker that is not a regular file is no worker: no switch (never guessed on), and nothing waits on it."""
    tree = tmp_path / "sglang"
    (tree / "srt" / "speculative").mkdir(parents=True)
    (tree / "__init__.py").write_text("")
    (tree / "version.py").write_text('__version__ = "0.5.16"\n')
    os.mkfifo(tree / plain_decode.PATH)
    status = main(["crossover", str(BASE), str(SPEC), "--sglang-source", str(tree), "--format", "json"])
    assert status == 0
    assert json.loads(capsys.readouterr().out)["tiers"]["switch"] is False


def test_bench_server_log_a_fifo_is_refused_before_any_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "server.log"
    os.mkfifo(fifo)
    status = main(["bench", "--url", "http://127.0.0.1:9", "--server-log", str(fifo), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert status == 2 and "--server-log" in err and "nothing was sent" in err


@pytest.mark.parametrize("value", ["0", "-3", "abc", "1e3", str(1 << 40)])
def test_verify_launch_threshold_out_of_range_is_a_usage_error(tmp_path: Path, value: str) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    with pytest.raises(SystemExit) as exc:
        run_cli("verify-launch", "--log", str(log), "--expect", "cuda-graph", "--plain-decode-min-bs", value)
    assert exc.value.code == 2


@pytest.mark.parametrize(
    "record",
    [
        '{"decode_batches": "many", "plain": {}, "speculative": {}}',
        '{"decode_batches": 5, "plain": {"1": 1.5}, "speculative": {}}',
        '{"decode_batches": 5, "plain": [], "speculative": {}}',
        '{"decode_batches": 5, "plain": {"-1": 3}, "speculative": {}}',
        '{"decode_batches": 5, "plain": {"1": 3}}',
        "[" * 100000,
        '{"decode_batches": 5, "plain": {"1": 3}, "speculative": {"2": ' + "9" * 5000 + "}}",
        '{"decode_batches": 5, "plain": {}, "speculative": {}, "draft_prefills_skipped": -2}',
        '{"decode_batches": 5, "plain": {}, "speculative": {}, "draft_prefills_skipped": true}',
        '{"decode_batches": 5, "plain": {}, "speculative": {}, "draft_prefills_skipped": "7"}',
    ],
)
def test_a_hostile_switch_line_in_a_log_is_no_record(record: str) -> None:
    line = f"[2026-12-06 03:26:10] {plain_decode.LOG_PREFIX}{record}"
    found = plain_decode.counts([line])
    assert found is None or found["speculative"] == {2: int("9" * 5000)}  # the last: valid, a big integer kept
    evidence = plain_decode.evidence([line])
    assert evidence is None or evidence.decode_batches == 5


def test_tiers_file_cannot_be_written_through_a_planted_link(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pol"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (out / tiers.TIERS_FILE).symlink_to(victim)
    source = str(release_dir("0.5.23"))
    status, _ = _crossover(capsys, "--sglang-source", source, "--write-policies", str(out), "--no-png", "--force")
    assert status == 0
    assert victim.read_text() == "keep"  # the link was replaced, the file it pointed to untouched
    assert json.loads((out / tiers.TIERS_FILE).read_text())["1"]["candidate_steps"]


# --- the tier builder's sweeps: one depth and one model per file, and none dropped without a word ---------------------

SPEC7 = FIXTURES / "h200-sglang-0.5.16-run2-spec-7.jsonl"


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _more_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: list[dict[str, object]]) -> tuple[int, str]:
    more = tmp_path / "more.jsonl"
    more.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "pol"
    source = str(release_dir("0.5.23"))
    status, err = _crossover(capsys, "--more-spec", str(more), "--sglang-source", source, "--write-policies", str(out))
    assert not (out / tiers.TIERS_FILE).exists() and "Traceback" not in err
    return status, err


def test_more_spec_mixing_two_depths_in_one_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _rows(SPEC7) + [r for r in _rows(SPEC) if int(str(r["concurrency"])) >= 10]
    status, err = _more_spec(tmp_path, capsys, rows)  # was read as 7 steps at every level, the 3-step ones too
    assert status == 2
    assert "mixes sweeps of different draft depths (3 steps at C=10, 30, 70, 100, 250; 7 steps at C=1, 2, 5)" in err


def test_more_spec_of_another_model_is_refused_naming_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{**r, "server": {**r["server"], "model_path": "/other/model"}} for r in _rows(SPEC7)]  # type: ignore[dict-item]
    status, err = _more_spec(tmp_path, capsys, rows)  # was taken as the same server's 7-step curve
    assert status == 2
    assert "measured on /other/model, but the speculative sweep on /tmp/sm120kit-models/serve/target" in err


def test_more_spec_with_no_level_free_of_failures_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{**r, "errors": r["requests"]} for r in _rows(SPEC7)]
    status, err = _more_spec(tmp_path, capsys, rows)  # was dropped: tiers without its depth, no word
    assert status == 2
    assert "no level in it finished without failed requests; bench it again" in err
