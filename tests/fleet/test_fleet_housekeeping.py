"""Fleet housekeeping (reliability probe items 11 and 17: F37, F5, F9, F14, F15, F25, F26, F27, F34, F36): report
files are never written through planted links, reports of another schema or tool and reports that repeat a check
are that node's error, a reader that goes away is not an error, a run directory holds only its own run's nodes,
`latest` and `--out` leave nothing behind on failure, and node files that are links are not followed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.fleet_files import FIXTURES, REAL, real_with, write_nodes
from sm120check.cli import main
from sm120check.fleet import render
from sm120check.fleet.collect import REACHED
from sm120check.fleet.load import load
from sm120check.fleet.model import NodeState

READY_RUN = FIXTURES / "run-ready"
BROKEN_RUN = FIXTURES / "run-broken"
SRC = Path(__file__).resolve().parents[2] / "python" / "sm120check" / "src"
SECRET = "root:x:0:0:SECRET-LINE:/root:/bin/bash\n"


def registered(stdout: str = REAL, rc: int = 0) -> dict[str, object]:
    return {"rc": rc, "stdout": stdout, "stderr": REACHED}


def results_file(tmp_path: Path, hosts: list[str]) -> Path:
    source = tmp_path / f"results-{len(hosts)}.json"
    source.write_text(json.dumps({host: registered() for host in hosts}), encoding="utf-8")
    return source


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("ORIGINAL\n", encoding="utf-8")
    return path


def plant(directory: Path, name: str, target: Path) -> None:
    """Links at every name a writer of `name` could predict: name.partial, name.tmp, .name.<pid>.tmp."""
    directory.mkdir(parents=True, exist_ok=True)
    names = [f"{name}.partial", f"{name}.tmp"] + [
        f".{name}.{pid}.tmp" for pid in range(os.getpid() - 5, os.getpid() + 5)
    ]
    for planted in names:
        (directory / planted).symlink_to(target)


# --- F37: temporary files never follow planted links -----------------------------------------------------------------


def test_report_write_and_out_never_write_through_planted_links(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = victim(tmp_path)
    out = tmp_path / "out"
    for name in render.FILE_NAMES.values():
        plant(out, name, target)
    plant(out, "matrix.txt", target)
    code = main(["fleet", "report", str(READY_RUN), "--write", str(out), "--out", str(out / "matrix.txt")])
    assert code == 1, capsys.readouterr().err  # the ready run's fixture has an unreachable node
    assert target.read_text(encoding="utf-8") == "ORIGINAL\n"
    for name in [*render.FILE_NAMES.values(), "matrix.txt"]:
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0


def test_collect_never_writes_node_files_through_planted_links(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = victim(tmp_path)
    run = tmp_path / "fleet" / "run1"
    for host in ("a", "b"):
        plant(run / "nodes", f"{host}.json", target)
    for name in render.FILE_NAMES.values():
        plant(run, name, target)
    code = main(["fleet", "collect", str(run), "--results", str(results_file(tmp_path, ["a", "b"])), "--no-latest"])
    capsys.readouterr()
    assert code in (0, 1)
    assert target.read_text(encoding="utf-8") == "ORIGINAL\n"
    assert {n.host for n in load(run).nodes} == {"a", "b"}
    assert not (run / "nodes" / "a.json").is_symlink()


# --- F5: schema and tool are checked ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (real_with(schema=99), "schema 99"),
        (real_with(tool="othertool"), '"othertool"'),
        (json.dumps({k: v for k, v in json.loads(REAL).items() if k != "schema"}), "schema null"),
        (json.dumps({"schema": 7, "host": "n", "state": "unreachable", "error": "gone"}), "schema 7"),
    ],
    ids=["schema-99", "other-tool", "no-schema", "stub-schema-7"],
)
def test_a_report_of_another_schema_or_tool_is_an_error_naming_it(tmp_path: Path, text: str, named: str) -> None:
    fleet = load(write_nodes(tmp_path / "run", {"odd": text, "good": REAL}))
    odd, good = fleet.node("odd"), fleet.node("good")
    assert odd is not None and odd.state is NodeState.ERROR and named in odd.error, odd
    assert good is not None and good.state is not NodeState.ERROR


# --- F9: duplicate check ids ----------------------------------------------------------------------------------------


def test_a_report_that_repeats_a_check_is_an_error_not_counted_twice(tmp_path: Path) -> None:
    document = json.loads(REAL)
    document["results"] = document["results"] + document["results"]
    fleet = load(write_nodes(tmp_path / "run", {"twice": json.dumps(document)}))
    node = fleet.node("twice")
    assert node is not None and node.state is NodeState.ERROR and "more than once" in node.error
    assert node.results == ()


# --- F14, F15: a reader that goes away --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["report", str(READY_RUN)],
        ["report", str(READY_RUN), "--format", "json"],
        ["diff", str(READY_RUN), str(BROKEN_RUN)],
        ["diff", str(READY_RUN), str(BROKEN_RUN), "--json"],
    ],
    ids=["report", "report-json", "diff", "diff-json"],
)
def test_a_closed_pipe_on_stdout_is_a_quiet_exit(args: list[str]) -> None:
    read_end, write_end = os.pipe()
    env = dict(os.environ, PYTHONPATH=str(SRC))
    child = subprocess.Popen(
        [sys.executable, "-m", "sm120check", "fleet", *args],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    os.close(write_end)
    os.close(read_end)  # the reader is gone before the child writes a byte (`| head` that already exited)
    _, stderr = child.communicate(timeout=60)
    assert child.returncode in (0, 1), stderr
    assert "Traceback" not in stderr and "Broken pipe" not in stderr and "BrokenPipeError" not in stderr


# --- F25: a reused run directory holds only this run's nodes ---------------------------------------------------------


def test_collect_into_a_reused_run_directory_keeps_only_this_runs_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "fleet" / "run1"
    main(["fleet", "collect", str(run), "--results", str(results_file(tmp_path, ["a", "b", "c"])), "--no-latest"])
    main(["fleet", "collect", str(run), "--results", str(results_file(tmp_path, ["a"])), "--no-latest"])
    out = capsys.readouterr().out
    assert [n.host for n in load(run).nodes] == ["a"]
    assert sorted(p.name for p in (run / "nodes").iterdir()) == ["a.json"]
    assert "b" not in json.loads((run / "fleet.json").read_text(encoding="utf-8"))["nodes"]
    assert "1 nodes" in out or "1 node" in out


# --- F26, F27: `latest` a real directory, a run directory without a name ---------------------------------------------


@pytest.mark.parametrize("kind", ["directory", "file"])
def test_collect_refuses_a_real_latest_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    fleet = tmp_path / "fleet"
    latest = fleet / "latest"
    if kind == "directory":
        latest.mkdir(parents=True)
    else:
        fleet.mkdir()
        latest.write_text("keep me\n", encoding="utf-8")
    code = main(["fleet", "collect", str(fleet / "run1"), "--results", str(results_file(tmp_path, ["a"]))])
    err = capsys.readouterr().err
    assert code == 2 and str(latest) in err and f"real {kind}" in err and "--no-latest" in err
    assert sorted(p.name for p in fleet.iterdir()) == ["latest"]  # no run1, no dangling .latest.<pid>
    assert not latest.is_symlink()


def test_collect_moves_latest_and_leaves_no_temporary_link(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet = tmp_path / "fleet"
    for name in ("run1", "run2"):
        main(["fleet", "collect", str(fleet / name), "--results", str(results_file(tmp_path, ["a"]))])
    capsys.readouterr()
    assert (fleet / "latest").readlink() == Path("run2")
    assert sorted(p.name for p in fleet.iterdir()) == ["latest", "run1", "run2"]


def test_collect_into_a_directory_without_a_name_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = results_file(tmp_path, ["a"])
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    code = main(["fleet", "collect", ".", "--results", str(source)])
    err = capsys.readouterr().err
    assert code == 2 and "has no name of its own" in err
    assert list(work.iterdir()) == []  # no nodes/


# --- F34: --out a directory --------------------------------------------------------------------------------------


def test_report_out_a_directory_fails_and_leaves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "target"
    out.mkdir()
    code = main(["fleet", "report", str(READY_RUN), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and str(out) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]  # no target.partial, no temporary
    assert list(out.iterdir()) == []


# --- F36: node files that are links -----------------------------------------------------------------------------------


def test_a_node_file_that_is_a_symlink_is_not_followed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "passwd"
    secret.write_text(SECRET, encoding="utf-8")
    run = write_nodes(tmp_path / "run", {"good": REAL})
    (run / "nodes" / "evil.json").symlink_to(secret)
    (run / "nodes" / "loop.json").symlink_to(run / "nodes" / "loop.json")
    fleet = load(run)
    for host in ("evil", "loop"):
        node = fleet.node(host)
        assert node is not None and node.state is NodeState.ERROR and "symbolic link" in node.error, node
    main(["fleet", "report", str(run), "--format", "md"])
    assert "SECRET-LINE" not in capsys.readouterr().out
