"""Every bench record names the all-reduce backend its server used, and `crossover` refuses sweeps whose backends
differ (PCIe-IPC moves the crossover, issue #38).

The servers are the bench's stand-in (simserver.py) reporting an SGLang version and tp_size in /server_info; the
server logs are SGLang 0.5.23's own lines, rendered from the format strings of its source
(.cache/sglang/0.5.23: srt/entrypoints/engine.py, http_server.py, distributed/device_communicators/pcie_ipc_ar.py).
The records of a real SGLang 0.5.16 server are tests/fixtures/bench.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.conftest import SIM_ARGS, Sim, run_subcommand
from lab.sglang_logs import LOG_PREFIX, log_formats, render
from lab.sglang_releases import release_dir
from sm120check.bench.records import read_jsonl
from sm120check.sglang.allreduce_backend import BACKEND_LINES
from sm120check.sglang.launch_patterns import LOG_PATTERNS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bench"
BASE, SPEC = (FIXTURES / f"h200-sglang-0.5.16-{name}.jsonl" for name in ("base", "spec"))
BENCH = ["--output-len", "16", "--input-len", "8", "--requests-per-level", "4", "--info-timeout", "10"]
VERSION = "0.5.23"


def _rendered(version: str, files: tuple[str, ...] | list[str], regex_search: Callable[[str], object]) -> str:
    for fmt in log_formats(release_dir(version), files):
        text = LOG_PREFIX + render(fmt, {}, "7")
        if regex_search(text):
            return text
    raise AssertionError(f"{version} prints no such line in {files}")


def server_log(tmp_path: Path, *row_ids: str, version: str = VERSION) -> Path:
    """A startup log of `version`: its server_args line, the PCIe-IPC lines named, its ready line."""
    rows = {r.id: r for r in LOG_PATTERNS}
    pcie = {r.id: r for r in BACKEND_LINES}
    lines = [_rendered(version, rows["server-start"].files, rows["server-start"].compiled.search)]
    lines += [_rendered(version, [pcie[i].file], pcie[i].compiled.search) for i in row_ids]
    lines.append(_rendered(version, rows["server-ready"].files, rows["server-ready"].compiled.search))
    path = tmp_path / f"sglang-{'-'.join(row_ids) or 'plain'}.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def bench(sim: Sim, out: Path, *extra: str) -> list[dict[str, object]]:
    assert run_subcommand("bench", "--url", sim.url, "--concurrency", "1,2", *BENCH, "--out", str(out), *extra) == 0
    servers = []
    for record in read_jsonl(out):
        server = record.meta["server"]
        assert isinstance(server, dict)
        servers.append(server)
    return servers


@pytest.fixture(scope="module")
def tp2(sim_factory: Callable[..., Sim]) -> tuple[Sim, Sim]:
    """A plain and a speculative stand-in reporting SGLang 0.5.23 at tp_size 2."""
    extra = ["--tp-size", "2", "--version", VERSION]
    return sim_factory("plain", *SIM_ARGS, *extra), sim_factory("spec", *SIM_ARGS, *extra)


def test_a_one_rank_server_records_no_all_reduce(plain_sim: Sim, tmp_path: Path) -> None:
    servers = bench(plain_sim, tmp_path / "base.jsonl")
    assert {s["allreduce_backend"] for s in servers} == {"none"}
    assert servers[0]["allreduce_backend_reason"] == "tp_size 1: one rank, no all-reduce"


def test_without_the_servers_log_the_backend_of_a_0_5_23_server_is_unknown(
    tp2: tuple[Sim, Sim], tmp_path: Path
) -> None:
    servers = bench(tp2[0], tmp_path / "base.jsonl")
    assert {s["allreduce_backend"] for s in servers} == {"unknown"}
    assert "--server-log FILE" in str(servers[0]["allreduce_backend_reason"])


def test_the_servers_log_names_pcie_ipc_in_every_record(tp2: tuple[Sim, Sim], tmp_path: Path) -> None:
    log = server_log(tmp_path, "pcie-ipc-enabled", "pcie-ipc-workspace-built")
    servers = bench(tp2[0], tmp_path / "base.jsonl", "--server-log", str(log))
    assert [s["allreduce_backend"] for s in servers] == ["pcie-ipc", "pcie-ipc"]
    assert str(servers[0]["allreduce_backend_reason"]).startswith("server log: workspace built")


def test_a_log_whose_communicator_gave_up_records_the_default_backend(tp2: tuple[Sim, Sim], tmp_path: Path) -> None:
    log = server_log(tmp_path, "pcie-ipc-enabled", "pcie-ipc-workspace-failed")
    servers = bench(tp2[0], tmp_path / "base.jsonl", "--server-log", str(log))
    assert {s["allreduce_backend"] for s in servers} == {"default"}


def test_an_unreadable_server_log_is_a_usage_error_before_any_load(
    tp2: tuple[Sim, Sim], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.log"
    argv = ["bench", "--url", tp2[0].url, "--concurrency", "1", *BENCH, "--out", str(tmp_path / "x.jsonl")]
    assert run_subcommand(*argv, "--server-log", str(missing)) == 2
    err = capsys.readouterr().err
    assert "--server-log" in err and str(missing) in err and "nothing was sent" in err


def test_crossover_refuses_sweeps_measured_on_different_backends_naming_both(
    tp2: tuple[Sim, Sim], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    on = server_log(tmp_path, "pcie-ipc-enabled", "pcie-ipc-workspace-built")
    off = server_log(tmp_path)  # a complete 0.5.23 startup without a PCIe-IPC line: the switch was not set
    base, spec = tmp_path / "base.jsonl", tmp_path / "spec.jsonl"
    bench(tp2[0], base, "--server-log", str(off))
    bench(tp2[1], spec, "--server-log", str(on))
    capsys.readouterr()
    assert run_subcommand("crossover", str(base), str(spec)) == 2
    err = capsys.readouterr().err
    assert "different all-reduce backends" in err
    assert f"{base} default" in err and f"{spec} pcie-ipc" in err


def test_crossover_pairs_sweeps_on_the_same_backend(
    tp2: tuple[Sim, Sim], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    on = server_log(tmp_path, "pcie-ipc-enabled", "pcie-ipc-workspace-built")
    base, spec = tmp_path / "base.jsonl", tmp_path / "spec.jsonl"
    bench(tp2[0], base, "--server-log", str(on))
    bench(tp2[1], spec, "--server-log", str(on))
    capsys.readouterr()
    assert run_subcommand("crossover", str(base), str(spec), "--format", "json") == 0
    report = json.loads(capsys.readouterr().out)
    assert not any("all-reduce" in w for w in report["warnings"])


def test_crossover_warns_when_one_sweeps_backend_is_unknown(
    tp2: tuple[Sim, Sim], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    on = server_log(tmp_path, "pcie-ipc-enabled", "pcie-ipc-workspace-built")
    base, spec = tmp_path / "base.jsonl", tmp_path / "spec.jsonl"
    bench(tp2[0], base)
    bench(tp2[1], spec, "--server-log", str(on))
    capsys.readouterr()
    assert run_subcommand("crossover", str(base), str(spec), "--format", "json") == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert any(w.startswith(f"the all-reduce backend of {base} is unknown") for w in warnings), warnings


def test_the_real_0_5_16_sweeps_read_as_one_rank_and_still_pair(capsys: pytest.CaptureFixture[str]) -> None:
    """Recorded before the field existed: their server_info (tp_size 1) says there was no all-reduce."""
    assert run_subcommand("crossover", str(BASE), str(SPEC), "--format", "json") == 0
    assert not any("all-reduce" in w for w in json.loads(capsys.readouterr().out)["warnings"])


def test_real_sweeps_whose_records_name_different_backends_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real 0.5.16 records, each server's backend field edited (labelled so here): crossover names both."""
    edited = []
    for path, backend in ((BASE, "default"), (SPEC, "pcie-ipc")):
        lines = []
        for text in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(text)
            record["server"]["allreduce_backend"] = backend
            lines.append(json.dumps(record))
        target = tmp_path / path.name
        target.write_text("\n".join(lines) + "\n", encoding="utf-8")
        edited.append(target)
    assert run_subcommand("crossover", *map(str, edited)) == 2
    err = capsys.readouterr().err
    assert f"{edited[0]} default" in err and f"{edited[1]} pcie-ipc" in err
