"""The fleet verdict under hostile or broken node output (reliability probe items 4 and 13: F7, F11, F12, F16-F20,
F24, F28-F30, F33): every node gets a verdict or a named error, one bad node never takes the matrix of the others,
and nothing a node wrote becomes markup, terminal escapes or broken XML in the reports."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

import pytest

from lab.fleet_files import REAL, real_with, write_nodes
from sm120check.cli import main
from sm120check.fleet import render
from sm120check.fleet.collect import REACHED
from sm120check.fleet.load import load
from sm120check.fleet.model import NodeState

DEEP = "[" * 200_000 + "]" * 200_000


def registered(stdout: str, rc: int = 0) -> dict[str, object]:
    return {"rc": rc, "stdout": stdout, "stderr": REACHED}


def collect(tmp_path: Path, results: Mapping[str, object], capsys: pytest.CaptureFixture[str]) -> tuple[int, Path, str]:
    source = tmp_path / "results.json"
    source.write_text(json.dumps(results), encoding="utf-8")
    run = tmp_path / "run"
    code = main(["fleet", "collect", str(run), "--results", str(source), "--no-latest"])
    return code, run, capsys.readouterr().out


def real_with_result(index: int, **changes: object) -> str:
    document = json.loads(REAL)
    document["results"][index].update(changes)
    return json.dumps(document)


# --- the verdict: a report with no checks, or a file that claims "ready", is never ready (F11, F12) ---


@pytest.mark.parametrize("stdout", [json.dumps({"results": []}), json.dumps({"state": "ready"})])
def test_a_node_without_check_results_is_never_ready(
    tmp_path: Path, stdout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, run, table = collect(tmp_path, {"good-node": registered(REAL), "hollow-node": registered(stdout)}, capsys)
    node = load(run).node("hollow-node")
    assert node is not None and node.state is NodeState.ERROR
    assert node.error  # named: says why there is no verdict
    assert code == 1
    assert table.startswith("sm120check fleet: NOT READY")


# --- a node's output that looks like the aggregate is that node's error, never a missing row (F24) ---


def test_a_node_that_prints_the_aggregates_tool_is_listed_not_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    evil = json.dumps({"tool": "sm120check fleet", "results": []})
    results = {f"good-{i}": registered(REAL) for i in range(3)} | {"evil-node": registered(evil, rc=1)}
    code, run, table = collect(tmp_path, results, capsys)
    fleet = load(run)
    assert sorted(n.host for n in fleet.nodes) == sorted(results)  # 4 hosts in, 4 rows
    evil_node = fleet.node("evil-node")
    assert evil_node is not None and evil_node.state is NodeState.ERROR
    assert code == 1 and "evil-node" in table
    aggregate = json.loads((run / "fleet.json").read_text(encoding="utf-8"))
    assert len(aggregate["nodes"]) == 4 and aggregate["ok"] is False


# --- a bad field or a deep document in one report: that node is an error, the rest render (F7, F28-F30, F33) ---


@pytest.mark.parametrize(
    "bad",
    [
        real_with(seconds="abc"),
        real_with(level="2"),
        real_with(version={"x": 1}),
        real_with_result(0, summary=["not", "a", "string"]),
        DEEP,
        '{"results": ' + DEEP + "}",
    ],
    ids=["seconds-text", "level-text", "version-object", "summary-list", "deep-array", "deep-results"],
)
def test_one_broken_report_is_that_nodes_error_and_the_matrix_still_renders(
    tmp_path: Path, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_nodes(tmp_path / "run", {"a-good": REAL, "b-broken": bad, "c-good": REAL})
    code = main(["fleet", "report", str(run), "--write", str(tmp_path / "out")])
    table = capsys.readouterr().out
    assert code == 1
    assert re.search(r"^a-good\s+ready\b", table, re.M) and re.search(r"^c-good\s+ready\b", table, re.M)
    assert re.search(r"^b-broken\s+error\b", table, re.M)
    for name in render.FILE_NAMES.values():
        assert (tmp_path / "out" / name).is_file()
    broken = load(run).node("b-broken")
    assert broken is not None and broken.error


def test_diff_with_a_broken_report_names_that_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write_nodes(tmp_path / "old", {"a-good": REAL, "b-node": REAL})
    new = write_nodes(tmp_path / "new", {"a-good": REAL, "b-node": real_with(seconds="NaN-ish")})
    assert main(["fleet", "diff", str(old), str(new)]) == 1
    assert "~ b-node: ready -> error" in capsys.readouterr().out


def test_collect_with_deep_json_writes_every_node_and_the_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = {"a-good": registered(REAL), "b-deep": registered(DEEP), "z-after": registered(REAL)}
    code, run, _ = collect(tmp_path, results, capsys)
    assert code == 1
    assert sorted(p.name for p in (run / "nodes").iterdir()) == ["a-good.json", "b-deep.json", "z-after.json"]
    states = {n.host: n.state for n in load(run).nodes}
    assert states == {"a-good": NodeState.READY, "b-deep": NodeState.ERROR, "z-after": NodeState.READY}
    assert all((run / name).is_file() for name in render.FILE_NAMES.values())


def test_an_oversized_node_file_is_that_nodes_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sm120check.fleet.load.MAX_NODE_BYTES", 4096)
    run = write_nodes(tmp_path / "run", {"big": json.dumps({"results": [], "pad": "x" * 10_000}), "ok": REAL})
    fleet = load(run)
    big = fleet.node("big")
    assert big is not None and big.state is NodeState.ERROR and "larger than" in big.error
    assert fleet.node("ok") is not None


# --- what a node wrote is data in the reports, never markup or escapes (F16-F20) ---

EVIL_HTML = "<img src=x onerror=alert(1)>"


def hostile_run(tmp_path: Path) -> Path:
    document = json.loads(REAL)
    document["results"][0].update(
        status="fail",
        summary=f"broken {EVIL_HTML} | pipe `tick` \x1b[31mred\x1b[0m \x00 nul \x01",
        details="before\n```\n<script>alert(2)</script>\n````\nafter \x00",
        remedy="run `this` | that <b>",
    )
    document["results"][1]["id"] = "man|ifest"
    hosts = {EVIL_HTML: document, "new\nline": document, "ansi\x1b[2Jhost": document}
    run = tmp_path / "run"
    (run / "nodes").mkdir(parents=True)
    for host, doc in hosts.items():
        (run / "nodes" / f"{host}.json").write_text(json.dumps(doc), encoding="utf-8")
    return run


def test_markdown_escapes_html_pipes_backticks_and_newlines(tmp_path: Path) -> None:
    md = render.markdown(load(hostile_run(tmp_path)))
    outside_code = re.sub(r"(`+)text\n.*?\n *\1\n", "", md, flags=re.S)  # fenced blocks are literal text
    outside_code = re.sub(r"(`+) ?.*? ?\1", "", outside_code)  # so are code spans
    assert "<img" not in outside_code and "<script" not in outside_code and "<b>" not in outside_code
    table = [line for line in md.splitlines() if line.startswith("| ")]
    columns = {len(re.split(r"(?<!\\)\|", line)) for line in table}
    assert len(columns) == 1  # a `|` in a check id or a host adds no column
    assert "### new line (failed)" in md  # one heading line for a host with a newline
    assert "\x1b" not in md and "\x00" not in md
    # the details' own fences cannot end the block they are in: the script stays inside it
    block = re.search(r"^( *)(`{3,})text\n(.*?)\n\1\2$", md, flags=re.S | re.M)
    assert block is not None and "<script>alert(2)</script>" in block.group(3) and "after" in block.group(3)


def test_table_passes_no_escape_sequences_to_the_terminal(tmp_path: Path) -> None:
    table = render.table(load(hostile_run(tmp_path)))
    assert "\x1b" not in table and "\x00" not in table and "\x01" not in table
    assert "ansihost" in table  # the sequence is removed, the name kept


def test_diff_passes_no_escape_sequences_to_the_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host = "ansi\x1b[2Jhost"
    old = write_nodes(tmp_path / "old", {host: REAL})
    new = write_nodes(tmp_path / "new", {host: real_with_result(0, status="fail", summary="bad \x1b]0;t\x07 \x00")})
    assert main(["fleet", "diff", str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert "~ ansihost: ready -> failed" in out
    assert "\x1b" not in out and "\x00" not in out and "\x07" not in out


def test_junit_is_well_formed_with_control_characters_in_the_evidence(tmp_path: Path) -> None:
    xml = render.to_junit(load(hostile_run(tmp_path)))
    root = ET.fromstring(xml.encode("utf-8"))
    failures = root.findall(".//failure")
    assert failures and all("\x1b" not in (f.get("message") or "") for f in failures)
    assert "nul" in (failures[0].get("message") or "")


# --- probe 2, N65: a node file whose report names another host -------------------------------------------------


def test_a_node_file_whose_report_names_another_host_is_pointed_out(tmp_path: Path) -> None:
    run = write_nodes(tmp_path / "run", {"N1": real_with(host="n1"), "n1": real_with(host="n1")})
    fleet = load(run)
    copied, own = fleet.node("N1"), fleet.node("n1")
    assert copied is not None and own is not None
    assert (copied.reported_host, own.reported_host) == ("n1", "")
    table = render.render(fleet, "table")
    assert table.split("Node files whose report names another host:\n", 1)[1].startswith(
        f"  N1: {run / 'nodes' / 'N1.json'} holds the report of host 'n1'; if that is not this node, the file was "
        "copied or renamed: run the fleet play again (it names each file after its host)\n"
    )
    nodes = {n["host"]: n for n in json.loads(render.render(fleet, "json"))["nodes"]}
    assert (nodes["N1"]["reported_host"], nodes["n1"]["reported_host"]) == ("n1", None)


# --- probe 3 JN6: an integer past Python's 4300-digit limit anywhere in the results ---


def test_results_with_a_5000_digit_integer_are_a_usage_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "results.json"
    source.write_text('{"node": {"rc": ' + "9" * 5000 + "}}", encoding="utf-8")
    code = main(["fleet", "collect", str(tmp_path / "run"), "--results", str(source), "--no-latest"])
    captured = capsys.readouterr()
    assert code == 2 and "Traceback" not in captured.err
    assert f"the results from {source} are not JSON (Exceeds the limit" in captured.err
    assert not (tmp_path / "run").exists()
