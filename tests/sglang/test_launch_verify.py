"""`sm120check sglang verify-launch` against log lines and server_info documents made from real SGLang releases.

Log lines are the releases' own logger format strings (read with ast from the unpacked wheels in .cache/sglang,
tests/lab/sglang_logs.py) filled with sample values; server_info documents carry the release's real ServerArgs
field names. Those tests are slow (they may download a release). The hostile-input and URL-bound tests need no
release and run in the fast tier, against a real HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from lab.loopback import serve
from lab.sglang_logs import LOG_PREFIX, log_formats, render, server_args_fields
from lab.sglang_releases import release_dir
from sm120check import cli
from sm120check.sglang import launch_cli
from sm120check.sglang.allreduce_backend import BACKEND_LINES, BackendLine, scan
from sm120check.sglang.launch_patterns import LOG_PATTERNS, LogPattern
from sm120check.sglang.launch_request import request_from_command
from sm120check.sglang.launch_terms import Expectation, Sign
from sm120check.sglang.server_info import MAX_SERVER_INFO_BYTES
from sm120check.versions import parse_or_none

# The releases the log table was read from (all of .cache/sglang from 0.5.9 on); the table test walks all of them.
TABLE_RELEASES = ("0.5.9", "0.5.10", "0.5.13", "0.5.14", "0.5.16", "0.5.22", "0.5.23")
# Sample values for placeholders whose value is a fixed word at run time (the rest get "7").
SAMPLES = {
    "graph_backend[self.device]": "cuda graph",
    "graph_backend[model_runner.device]": "CUDA graph",
    "capture_name": "target verify",
    "server_args": "ServerArgs(model_path='/models/Kimi-K2.5-NVFP4', tp_size=8)",
    "_server_args_for_logging(server_args)": "{'model_path': '/models/Kimi-K2.5-NVFP4', 'tp_size': 8}",
}
LAUNCH = (
    "/opt/sm120kit/venv/bin/python -m sglang.launch_server --model-path /models/Kimi-K2.5-NVFP4 --tp-size 8 "
    "--host 127.0.0.1 --port 30000 --speculative-algorithm EAGLE3 --speculative-draft-model-path "
    "/models/Kimi-K2.5-EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 "
    "--speculative-adaptive --speculative-adaptive-config /etc/sm120kit/sglang-spec-adaptive.json "
    "--flashinfer-allreduce-fusion-backend auto --enable-torch-symm-mem\n"
)
PATTERNS = {p.id: p for p in LOG_PATTERNS}


# --- running the command ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    status: int
    out: str
    err: str

    @property
    def report(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.out)
        return doc

    def verdict(self, expectation: str) -> dict[str, Any]:
        found: dict[str, Any] = next(v for v in self.report["verdicts"] if v["expectation"] == expectation)
        return found


def verify(*argv: str) -> Run:
    """`sm120check sglang verify-launch ARGV` through the real command line, in-process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(["sglang", "verify-launch", *argv])
        except SystemExit as exc:  # argparse usage errors
            status = int(exc.code or 0)
    return Run(status, out.getvalue(), err.getvalue())


# --- a real HTTP server on 127.0.0.1 ---------------------------------------------------------------------------------


@dataclass
class Route:
    status: int = 200
    body: bytes = b"{}"
    stall: bool = False  # accept the request, never answer


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    routes: dict[str, Route]
    release: threading.Event

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that stops reading a huge body is expected here


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        name, _, rest = self.path.lstrip("/").partition("/")
        route = self.server.routes.get(name)
        if route is None or rest not in ("server_info", "get_server_info", "health"):
            self.send_error(404)
            return
        if route.stall:
            self.server.release.wait(60)
            return
        self.send_response(route.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(route.body)))
        self.end_headers()
        self.wfile.write(route.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class Docs:
    """Serves each document under its own path prefix: `docs.url("name")` is the --url for it."""

    server: _Server

    def add(
        self, name: str, doc: object = None, *, raw: bytes | None = None, status: int = 200, stall: bool = False
    ) -> str:
        body = raw if raw is not None else json.dumps(doc).encode()
        self.server.routes[name] = Route(status, body, stall)
        return self.url(name)

    def url(self, name: str) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/{name}"


@pytest.fixture(scope="module")
def docs() -> Iterator[Docs]:
    with serve(_Handler, _Server) as server:
        assert isinstance(server, _Server)
        server.routes, server.release = {}, threading.Event()
        try:
            yield Docs(server)
        finally:
            server.release.set()


# --- documents from a release ----------------------------------------------------------------------------------------


def server_info(version: str, **fields: object) -> dict[str, object]:
    """A /server_info of `version` for the LAUNCH above, healthy unless `fields` say otherwise: every top-level key
    is one of the release's ServerArgs field names (plus the extras the endpoint adds)."""
    names = server_args_fields(release_dir(version))
    healthy: dict[str, object] = {
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_adaptive": True,
        "enable_torch_symm_mem": True,
        "flashinfer_allreduce_fusion_backend": "trtllm",
        "enable_flashinfer_allreduce_fusion": False,
        "enforce_disable_flashinfer_allreduce_fusion": False,
        "disable_cuda_graph": False,
        "cuda_graph_config": {"decode": {"backend": "full", "max_bs": 64}, "prefill": {"backend": "disabled"}},
    }
    wrong = sorted(set(healthy) - names) + sorted(set(fields) - names)
    assert not wrong, f"not ServerArgs fields of {version}: {wrong}"
    doc: dict[str, object] = dict.fromkeys(sorted(names))
    doc.update(healthy)
    doc.update(fields)
    doc["version"] = version
    doc["internal_states"] = [{"avg_spec_accept_length": 2.41, "memory_usage": {"weight": 70.1, "graph": 1.37}}]
    return doc


def line(version: str, pattern: str, contains: str = "", default: str = "7", **samples: str) -> str:
    """The line `version` prints for a table row: a format in the row's files (with `contains` in its literal
    text), rendered with the samples; the row's regex must recognise it."""
    row = PATTERNS[pattern]
    for fmt in log_formats(release_dir(version), row.files):
        text = LOG_PREFIX + render(fmt, {**SAMPLES, **samples}, default)
        if contains in fmt.text and row.compiled.search(text):
            return text
    raise AssertionError(f"{version} prints no {pattern} line with {contains!r}")


def healthy_log(version: str) -> list[str]:
    """The startup lines of the LAUNCH above on `version`, in the order SGLang prints them."""
    return [
        line(version, "server-start", "server_args="),
        line(version, "adaptive-initialized", **{"first_slot.current_steps": "3"}),
        line(version, "fusion-workspace-initialized"),
        line(version, "cuda-graph-captured", "{} end.", capture_name="target verify"),  # decode, not prefill
        line(version, "speculative-draft-graph"),
        line(version, "server-ready"),
    ]


def write_log(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "sglang.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def launch_file(tmp_path: Path, text: str = LAUNCH) -> str:
    path = tmp_path / "launch-command.txt"
    path.write_text(text, encoding="utf-8")
    return str(path)


def run_release(tmp_path: Path, docs: Docs, version: str, log: list[str], **fields: object) -> Run:
    url = docs.add(f"{tmp_path.name}-{version}", server_info(version, **fields))
    return verify("--log", write_log(tmp_path, log), "--url", url, "--launch-command", launch_file(tmp_path), "--json")


# --- the table against the releases -----------------------------------------------------------------------------------


def _version(text: str) -> tuple[int, ...]:
    parsed = parse_or_none(text)
    assert parsed, text
    return parsed


@pytest.mark.slow
@pytest.mark.parametrize("pattern", LOG_PATTERNS, ids=[p.id for p in LOG_PATTERNS])
def test_every_table_line_is_printed_by_each_release_it_claims(pattern: LogPattern) -> None:
    first, last = _version(pattern.first), _version(pattern.last)
    assert first <= last
    for version in TABLE_RELEASES:
        formats = log_formats(release_dir(version), pattern.files)
        printed = [f for f in formats if pattern.compiled.search(render(f, SAMPLES))]
        claimed = first <= _version(version) <= last
        where = f"{pattern.id} in {version} ({', '.join(pattern.files)})"
        if claimed:
            assert printed, f"{where}: no logger call or raise prints a line that {pattern.regex!r} matches"
        else:
            assert not printed, f"{where}: printed outside {pattern.first}..{pattern.last}: {printed[0]}"


def test_table_covers_every_expectation_with_a_degraded_line() -> None:
    for expectation in Expectation:
        if expectation is not Expectation.SPECULATIVE:  # speculation off shows in server_args only
            assert any(p.expectation is expectation and p.sign is Sign.DEGRADED for p in LOG_PATTERNS)
    assert all(p.fix for p in LOG_PATTERNS if p.sign is Sign.DEGRADED)


# --- verdicts from release-made documents -----------------------------------------------------------------------------

RELEASES = ("0.5.16", "0.5.23")


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_a_healthy_launch_is_ok_on_every_expectation(tmp_path: Path, docs: Docs, version: str) -> None:
    run = run_release(tmp_path, docs, version, healthy_log(version))
    assert run.status == 0, run.out + run.err
    report = run.report
    assert report["expected"] == ["cuda-graph", "speculative", "adaptive", "fusion", "symm-mem"]
    assert report["degraded"] == [] and report["unknown"] == []
    assert report["sglang_version"] == version and report["version_origin"] == "server_info"
    assert "avg_spec_accept_length 2.41" in str(run.verdict("speculative")["summary"])
    assert report["data"] == {
        "avg_spec_accept_length": 2.41,
        "graph_memory_gb": 1.37,
        "max_running_requests": None,
        "plain_decode": None,  # no speculation switch in this server's log
        "http_workers": None,  # one HTTP process
        "allreduce_backend": "default",  # no PCIe-IPC line: SGLang's own choice
        "allreduce": report["data"]["allreduce"],
    }


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_fusion_skipped_by_the_preflight_is_degraded_with_the_patch_as_fix(
    tmp_path: Path, docs: Docs, version: str
) -> None:
    error = "cuMulticastGetGranularity failed for FlashInfer workspace preflight: CUresult.CUDA_ERROR_NOT_SUPPORTED"
    skip = line(version, "fusion-preflight-probe", default=error)
    log = [
        line(version, "server-start", "server_args="),
        skip,
        skip.replace("TP0", "TP1"),
        line(version, "fusion-preflight-vote"),
        *healthy_log(version)[3:],
    ]
    run = run_release(tmp_path, docs, version, log)
    assert run.status == 1
    fusion = run.verdict("fusion")
    assert fusion["verdict"] == "degraded"
    assert "FlashInfer workspace preflight probe failed (cuMulticastGetGranularity" in str(fusion["summary"])
    assert "(log line 2, 2x)" in str(fusion["summary"])
    assert "sm120check sglang patch" in str(fusion["fix"]) and "sglang_sm120" in str(fusion["fix"])
    assert run.report["degraded"] == ["fusion"]
    assert any("degraded fusion: " in p and "Fix: " in p for p in run.report["problems"])


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_symmetric_memory_that_turned_itself_off_is_degraded(tmp_path: Path, docs: Docs, version: str) -> None:
    log = [*healthy_log(version), line(version, "symm-mem-multicast")]
    run = run_release(tmp_path, docs, version, log)
    assert run.status == 1
    symm = run.verdict("symm-mem")
    assert symm["verdict"] == "degraded"
    assert "TorchSymmMemCommunicator: torch symmetric memory multicast" in str(symm["summary"])
    assert "sm120check sglang scan" in str(symm["fix"])


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_speculation_asked_for_but_off_in_server_args_is_degraded(tmp_path: Path, docs: Docs, version: str) -> None:
    run = run_release(tmp_path, docs, version, healthy_log(version)[:4], speculative_algorithm=None)
    assert run.status == 1
    spec = run.verdict("speculative")
    assert spec["verdict"] == "degraded"
    assert spec["summary"] == "server_args.speculative_algorithm=null"
    assert "EAGLE3" in str(spec["fix"])


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_cuda_graphs_disabled_by_the_server_args_name_the_reason(tmp_path: Path, docs: Docs, version: str) -> None:
    reason = line(version, "cuda-graph-disabled", "because of using torch native attention backend")
    log = [healthy_log(version)[0], reason, *healthy_log(version)[1:3]]
    graphs_off = {"decode": {"backend": "disabled"}, "prefill": {"backend": "disabled"}}
    run = run_release(tmp_path, docs, version, log, disable_cuda_graph=True, cuda_graph_config=graphs_off)
    assert run.status == 1
    graph = run.verdict("cuda-graph")
    assert graph["verdict"] == "degraded"
    assert "disable_cuda_graph=true" in str(graph["summary"])
    assert 'cuda_graph_config.decode.backend="disabled"' in str(graph["summary"])
    assert any(
        "Cuda graph is disabled because of using torch native attention backend" in e["text"] for e in graph["evidence"]
    )


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_adaptive_speculation_the_server_turned_off_is_degraded(tmp_path: Path, docs: Docs, version: str) -> None:
    why = "speculative_eagle_topk=4 (only topk=1 is supported)"
    log = [healthy_log(version)[0], line(version, "adaptive-disabled", reason=why)]
    log += healthy_log(version)[2:]
    run = run_release(tmp_path, docs, version, log, speculative_adaptive=False, speculative_eagle_topk=4)
    assert run.status == 1
    adaptive = run.verdict("adaptive")
    assert adaptive["verdict"] == "degraded"
    assert "speculative_adaptive=false" in str(adaptive["summary"])
    assert any(why in e["text"] for e in adaptive["evidence"])


@pytest.mark.slow
def test_lines_of_an_earlier_run_do_not_count_after_a_restart(tmp_path: Path, docs: Docs) -> None:
    version = "0.5.23"
    old = [line(version, "server-start", "server_args="), line(version, "symm-mem-multicast")]
    run = run_release(tmp_path, docs, version, old + healthy_log(version))
    assert run.status == 0, run.out
    assert run.report["log"]["starts"] == 2
    assert any("2 server starts" in n for n in run.report["notes"])


@pytest.mark.slow
def test_a_complete_startup_without_a_fusion_workspace_means_fusion_never_ran(tmp_path: Path) -> None:
    version = "0.5.23"
    log = [x for x in healthy_log(version) if "workspace initialized" not in x]
    run = verify("--log", write_log(tmp_path, log), "--launch-command", launch_file(tmp_path), "--json")
    assert run.status == 1
    fusion = run.verdict("fusion")
    assert fusion["verdict"] == "degraded" and "never ran" in str(fusion["summary"])
    assert run.verdict("symm-mem")["verdict"] == "ok"  # no disable line in a complete startup
    assert run.verdict("speculative")["verdict"] == "ok"  # the draft graphs were captured


@pytest.mark.slow
def test_a_log_whose_start_was_cut_off_leaves_log_only_facts_unknown(tmp_path: Path) -> None:
    version = "0.5.23"
    log = healthy_log(version)[1:]  # no server_args line: the start of this run is not in what was read
    run = verify("--log", write_log(tmp_path, log), "--expect", "symm-mem,fusion", "--json")
    assert run.status == 0
    assert run.verdict("symm-mem")["verdict"] == "unknown"
    assert "does not cover this run's startup" in str(run.verdict("symm-mem")["summary"])
    assert run.verdict("fusion")["verdict"] == "ok"  # a confirmation line counts wherever it is
    assert verify("--log", write_log(tmp_path, log), "--expect", "symm-mem", "--strict").status == 1


@pytest.mark.slow
def test_text_output_names_the_reason_and_the_fix(tmp_path: Path, docs: Docs) -> None:
    version = "0.5.23"
    log = [*healthy_log(version), line(version, "symm-mem-world-size")]
    url = docs.add("text", server_info(version))
    run = verify("--log", write_log(tmp_path, log), "--url", url, "--launch-command", launch_file(tmp_path))
    assert run.status == 1
    assert "degraded  symm-mem" in run.out and "TorchSymmMemCommunicator: World size 7 not supported" in run.out
    assert "fix: run `sm120check sglang scan`" in run.out
    assert "1 of 5 degraded: symm-mem" in run.out


# --- the launch command -----------------------------------------------------------------------------------------------


def test_launch_command_file_sets_the_expectations() -> None:
    request = request_from_command(LAUNCH, "file")
    assert [e.value for e in request.expected] == ["cuda-graph", "speculative", "adaptive", "fusion", "symm-mem"]
    assert request.speculative_algorithm == "EAGLE3" and request.fusion_backend == "auto"
    plain = request_from_command(
        "python -m sglang.launch_server --model-path /m --enforce-disable-flashinfer-allreduce-fusion "
        "--cuda-graph-backend-decode=disabled",
        "file",
    )
    assert plain.expected == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("python -m vllm.entrypoints 'x", "not a shell command line"),
        ("/bin/true --x", "does not launch"),
    ],
)
def test_a_launch_command_that_is_not_one_is_refused(tmp_path: Path, text: str, message: str) -> None:
    run = verify("--log", write_log(tmp_path, ["x"]), "--launch-command", launch_file(tmp_path, text))
    assert run.status == 2 and message in run.err and "Traceback" not in run.err


# --- hostile server_info and the URL bound (fast tier: no release needed) ---------------------------------------------

HOSTILE: Mapping[str, tuple[bytes, str]] = {
    "not-json": (b"<html>502 Bad Gateway</html>", "server_info is not JSON"),
    "a-list": (b"[1, 2, 3]", "server_info is an array, expected an object"),
    "nested": (b"[" * 200_000 + b"]" * 200_000, "server_info is not JSON (nested too deeply)"),
    "bool-as-string": (
        b'{"disable_cuda_graph": "yes", "speculative_algorithm": "EAGLE3"}',
        "server_info field 'disable_cuda_graph' is a string (\"yes\"), expected true or false",
    ),
    "number-as-algorithm": (b'{"speculative_algorithm": 3}', "'speculative_algorithm' is a number (3)"),
    "backend-as-number": (
        b'{"cuda_graph_config": {"decode": {"backend": 1}}}',
        "'cuda_graph_config.decode.backend' is a number (1), expected a string or null",
    ),
    "states-not-a-list": (b'{"internal_states": "ok"}', "'internal_states' is a string, expected an array"),
    "nan-accept-length": (
        b'{"internal_states": [{"avg_spec_accept_length": NaN}]}',
        "'internal_states[0].avg_spec_accept_length' is a number (NaN), expected a finite number",
    ),
    "zero-running-cap": (
        b'{"max_running_requests": 0}',
        "server_info field 'max_running_requests' is a number (0), expected a whole number >= 1",
    ),
    "running-cap-as-string": (b'{"max_running_requests": "48"}', "'max_running_requests' is a string (\"48\")"),
    "huge": (b'{"pad": "' + b"x" * (MAX_SERVER_INFO_BYTES + 10) + b'"}', "larger than 8388608 bytes"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_server_info_exits_2_with_a_clear_message(docs: Docs, name: str) -> None:
    body, message = HOSTILE[name]
    run = verify("--url", docs.add(f"hostile-{name}", raw=body), "--expect", "cuda-graph", "--json")
    assert run.status == 2
    assert message in run.err, run.err
    assert "Traceback" not in run.err
    assert json.loads(run.out)["error"] == run.err.split(": ", 1)[1].strip()


def test_a_server_that_never_answers_is_given_up_within_the_bound(docs: Docs) -> None:
    url = docs.add("stalled", {}, stall=True)
    run = verify("--url", url, "--expect", "speculative", "--timeout", "0.5", "--retries", "2")
    assert run.status == 2
    assert f"no server_info from {url} within 0.5 s x 2 attempt(s)" in run.err


def test_a_closed_port_is_unreachable_with_exit_2(tmp_path: Path) -> None:
    run = verify("--url", "http://127.0.0.1:9", "--expect", "fusion", "--timeout", "0.5", "--retries", "1")
    assert run.status == 2 and "no server_info from http://127.0.0.1:9" in run.err


def test_credentials_in_the_url_are_never_printed(docs: Docs) -> None:
    url = docs.add("private", {"speculative_algorithm": "EAGLE3", "version": "0.5.23"})
    secret = url.replace("http://", "http://admin:hunter2@") + "?token=s3cret"
    ok = verify("--url", secret, "--expect", "speculative", "--json")
    assert ok.status == 0, ok.err
    assert ok.report["url"] == url
    bad = verify("--url", "ftp://admin:hunter2@127.0.0.1/x", "--expect", "speculative")
    assert bad.status == 2 and "'ftp://127.0.0.1/x' is not an http(s) URL" in bad.err
    for run in (ok, bad):
        assert "hunter2" not in run.out + run.err and "s3cret" not in run.out + run.err


def test_an_http_error_names_the_status(docs: Docs) -> None:
    run = verify("--url", docs.add("forbidden", {}, status=401), "--expect", "speculative")
    assert run.status == 2 and "HTTP 401" in run.err and "--api-key" in run.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ("--log", "/nonexistent/sglang.log", "--expect", "fusion"),
            "--log /nonexistent/sglang.log: No such file or directory; give the server's log file",
        ),
        (("--log", "/", "--expect", "fusion"), "--log /: is a directory, not a regular file"),
        (("--log", "/dev/null", "--expect", "fusion,graphs"), "unknown expectation 'graphs'"),
        (("--expect", "fusion"), "nothing to verify against"),
        (("--log", "/dev/null"), "not a regular file"),
        (("--url", "http://127.0.0.1:99999", "--expect", "fusion"), "is not a URL"),
        (("--journal-unit", "--evil", "--expect", "fusion"), "expected one argument"),
        (("--journal-unit", "bad unit;rm", "--expect", "fusion"), "is not a systemd unit name"),
    ],
)
def test_usage_and_io_errors_exit_2_naming_the_value(argv: tuple[str, ...], message: str) -> None:
    run = verify(*argv)
    assert run.status == 2
    assert message in run.err, run.err
    assert "Traceback" not in run.err


def test_log_reads_are_bounded_and_control_characters_are_escaped(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    symm = "TorchSymmMemCommunicator: torch symmetric memory multicast operations are not supported."
    with path.open("w", encoding="utf-8") as handle:
        handle.write(f"{LOG_PREFIX}server_args=ServerArgs()\n{LOG_PREFIX}{symm}\n")
        handle.write(("x" * 1000 + "\n") * 3000)  # ~3 MB of noise after the lines that matter
        handle.write(f"{LOG_PREFIX}\x1b[31m{symm}\x1b[0m\n")
    run = verify("--log", str(path), "--expect", "symm-mem", "--max-log-mib", "1", "--json")
    assert run.status == 1
    log = run.report["log"]
    assert log["truncated"] is True and log["start_line"] is None
    # colour codes are removed (safetext.terminal_text, as everywhere), the line they coloured kept
    assert "\x1b" not in run.out and "[31m" not in run.out and symm in run.out


def fake_journalctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> Path:
    """A `journalctl` first on PATH that records its argv and runs `script` (sh)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "journalctl"
    tool.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "argv"}\n{script}\n', encoding="utf-8")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return tmp_path / "argv"


def test_journal_unit_reads_this_boots_journal_of_the_unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    symm = "TorchSymmMemCommunicator: torch symmetric memory multicast operations are not supported."
    log = tmp_path / "journal.txt"
    log.write_text(f"{LOG_PREFIX}server_args=ServerArgs()\n{LOG_PREFIX}{symm}\n", encoding="utf-8")
    argv = fake_journalctl(tmp_path, monkeypatch, f"cat {log}")
    run = verify("--journal-unit", "sglang-server", "--expect", "symm-mem", "--json")
    assert run.status == 1, run.err
    assert argv.read_text().split() == ["-u", "sglang-server", "-b", "--no-pager", "-q", "-o", "cat"]
    assert run.report["log"]["source"] == "journal of unit sglang-server"
    assert run.verdict("symm-mem")["verdict"] == "degraded"


def test_a_journal_that_fails_or_hangs_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_journalctl(tmp_path, monkeypatch, 'echo "Failed to add match: bad unit" >&2; exit 1')
    failed = verify("--journal-unit", "sglang-server", "--expect", "symm-mem")
    assert failed.status == 2 and "failed (exit 1): Failed to add match: bad unit" in failed.err
    monkeypatch.setattr(launch_cli, "JOURNAL_TIMEOUT_S", 0.5)
    (tmp_path / "bin" / "journalctl").write_text("#!/bin/sh\necho partial\nsleep 30\n", encoding="utf-8")
    hung = verify("--journal-unit", "sglang-server", "--expect", "symm-mem")
    assert hung.status == 2 and "did not finish within 0.5 s" in hung.err


def test_the_server_version_reaches_the_terminal_inert(docs: Docs) -> None:
    # Probe 2, N8: server_info's version was printed raw while the other fields were escaped.
    url = docs.add(
        "hostile-version", {"speculative_algorithm": "EAGLE3", "version": "0.5.9\x1b[2J\x1b]0;pwned\x07\x00"}
    )
    run = verify("--url", url, "--expect", "speculative")
    assert run.status == 0, run.err
    assert not any(c in run.out for c in "\x1b\x07\x00")
    assert run.out.startswith("SGLang 0.5.9\\x00 (server_info); at ")


def test_a_speculation_expected_with_expect_is_named_in_the_fix(docs: Docs) -> None:
    # Probe 2, N10: the fix said "the launch asked for None" when --expect, not a launch command, set the expectation.
    run = verify(
        "--url",
        docs.add("no-spec", {"speculative_algorithm": None, "version": "0.5.23"}),
        "--expect",
        "speculative",
        "--json",
    )
    assert run.status == 1
    fix = run.verdict("speculative")["fix"]
    assert "None" not in fix
    assert fix.startswith("the server runs without speculation although the launch asked for speculation (--expect): ")


SECONDS = "give a number of seconds more than 0 and at most 3600"
MIB = "give a number of MiB more than 0 and at most 1024"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        # probe 2, N19, N27, N28, N29: tracebacks from threading and int(), a MemoryError, a 5.5 h retry loop
        (("--timeout", "nan"), f"--timeout: 'nan' is not a finite number; {SECONDS}"),
        (("--timeout", "inf"), f"--timeout: 'inf' is not a finite number; {SECONDS}"),
        (("--max-log-mib", "nan"), f"--max-log-mib: 'nan' is not a finite number; {MIB}"),
        (("--max-log-mib", "100000"), f"--max-log-mib: '100000' is out of range; {MIB}"),
        (("--retries", "100000"), "--retries: '100000' is out of range; give a whole number of attempts from 1 to 100"),
    ],
)
def test_numeric_options_out_of_range_are_usage_errors_naming_the_value(argv: tuple[str, ...], said: str) -> None:
    run = verify("--log", "/dev/null", "--expect", "fusion", *argv)
    assert run.status == 2
    assert f"sm120check sglang verify-launch: error: argument {said}\n" in run.err
    assert "Traceback" not in run.err


# --- the all-reduce backend (PCIe-IPC, SGLang 0.5.22+) ---------------------------------------------------------------
# Every line rendered from the format strings of the releases' sources (srt/distributed/device_communicators/
# pcie_ipc_ar.py, srt/distributed/parallel_state.py), as SGLang prints them.

PCIE_RELEASES = ("0.5.22", "0.5.23")
ROWS = {r.id: r for r in BACKEND_LINES}
PCIE_SAMPLES = {"e": "CUDA error: peer access is not supported between these two devices", "dtype": "torch.float16"}


def pcie_line(version: str, row_id: str, **samples: str) -> str:
    """The line `version` prints for a row: a logger call of the row's file, rendered, that the row's regex reads."""
    row = ROWS[row_id]
    for fmt in log_formats(release_dir(version), [row.file]):
        text = LOG_PREFIX + render(fmt, {**PCIE_SAMPLES, **samples}, "7")
        if row.compiled.search(text):
            return text
    raise AssertionError(f"{version} prints no {row_id} line")


def with_lines(version: str, *extra: str) -> list[str]:
    """A healthy startup of `version` with the communicator's lines before graph capture."""
    log = healthy_log(version)
    return [log[0], *extra, *log[1:]]


@pytest.mark.parametrize("row", BACKEND_LINES, ids=[r.id for r in BACKEND_LINES])
def test_every_backend_line_is_printed_by_both_releases_and_not_before(row: BackendLine) -> None:
    for version in PCIE_RELEASES:
        assert pcie_line(version, row.id)
    formats = log_formats(release_dir("0.5.16"), [row.file])
    assert not [f for f in formats if row.compiled.search(render(f, PCIE_SAMPLES))], "0.5.16 has no PCIe-IPC all-reduce"


@pytest.mark.slow
@pytest.mark.parametrize("version", PCIE_RELEASES)
def test_a_built_workspace_reports_pcie_ipc_with_its_size(tmp_path: Path, docs: Docs, version: str) -> None:
    lines = [
        pcie_line(version, "pcie-ipc-enabled", world_size="2"),
        pcie_line(version, "pcie-ipc-workspace-built"),
        pcie_line(version, "pcie-ipc-autotuned"),
    ]
    run = run_release(tmp_path, docs, version, with_lines(version, *lines))
    assert run.status == 0, run.out + run.err
    data = run.report["data"]
    assert data["allreduce_backend"] == "pcie-ipc"
    assert data["allreduce"]["max_numel"] == 7
    assert [x["id"] for x in data["allreduce"]["lines"]] == [
        "pcie-ipc-enabled",
        "pcie-ipc-workspace-built",
        "pcie-ipc-autotuned",
    ]
    assert any(n.startswith("all-reduce backend: pcie-ipc (workspace built") for n in run.report["notes"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("row_id", "said"),
    [
        ("pcie-ipc-workspace-failed", "error: 7"),  # a %-format: every field renders as 7
        ("pcie-ipc-setup-failed", "peer access is not supported"),
        ("pcie-ipc-deterministic", "--enable-deterministic-inference"),
        ("pcie-ipc-no-flashinfer", "FlashInfer"),
    ],
)
def test_a_communicator_that_stayed_off_reports_the_default_backend_and_why(
    tmp_path: Path, docs: Docs, row_id: str, said: str
) -> None:
    version = "0.5.23"
    extra = [pcie_line(version, "pcie-ipc-enabled"), pcie_line(version, row_id)]
    run = run_release(tmp_path, docs, version, with_lines(version, *extra))
    data = run.report["data"]
    assert data["allreduce_backend"] == "default"
    note = next(n for n in run.report["notes"] if n.startswith("all-reduce backend:"))
    assert "PCIe-IPC asked for, but" in note
    assert said in note


def test_bf16_only_is_a_note_on_a_pcie_ipc_server() -> None:
    version = "0.5.22"
    lines = with_lines(
        version,
        pcie_line(version, "pcie-ipc-enabled"),
        pcie_line(version, "pcie-ipc-workspace-built"),
        pcie_line(version, "pcie-ipc-bf16-only"),
    )
    found = scan(lines)
    assert found.backend.value == "pcie-ipc"
    assert "reductions of another dtype stay on the default backend" in found.reason


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
def test_a_startup_without_pcie_ipc_lines_reports_the_default_backend(tmp_path: Path, docs: Docs, version: str) -> None:
    run = run_release(tmp_path, docs, version, healthy_log(version))
    assert run.report["data"]["allreduce_backend"] == "default"
    assert any("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE unset" in n for n in run.report["notes"])


def test_lines_of_an_earlier_run_do_not_count(tmp_path: Path) -> None:
    version = "0.5.23"
    earlier = with_lines(version, pcie_line(version, "pcie-ipc-workspace-built"))
    run = verify("--log", write_log(tmp_path, [*earlier, *healthy_log(version)]), "--expect", "cuda-graph", "--json")
    assert run.report["data"]["allreduce_backend"] == "default"


def test_a_log_without_its_start_leaves_the_backend_unknown(tmp_path: Path) -> None:
    version = "0.5.23"
    run = verify("--log", write_log(tmp_path, healthy_log(version)[1:-1]), "--expect", "cuda-graph", "--json")
    assert run.report["data"]["allreduce_backend"] == "unknown"


def test_no_log_read_leaves_the_backend_unknown(docs: Docs) -> None:
    url = docs.add("no-log-backend", server_info("0.5.23"))
    run = verify("--url", url, "--expect", "cuda-graph", "--json")
    assert run.report["data"]["allreduce_backend"] == "unknown"
    assert run.report["data"]["allreduce"] is None


# --- the HTTP processes -------------------------------------------------------------------------------------------


def worker_start(version: str, pid: int) -> str:
    """The line `version` prints when one of its HTTP (tokenizer) processes starts."""
    fmt = next(
        f for f in log_formats(release_dir(version), ["srt/entrypoints/http_server.py"])
        if "Start multi-tokenizer worker process" in f.text
    )  # fmt: skip
    return LOG_PREFIX + render(fmt, {}, str(pid))


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_http_processes_killed_after_ready_fail_the_launch_with_the_health_check_fix(
    tmp_path: Path, docs: Docs, version: str
) -> None:
    log = healthy_log(version)
    start = log[0] + " tokenizer_worker_num=4, detokenizer_worker_num=1"
    killed = [
        f"{LOG_PREFIX}INFO:     {text}"
        for pid in (90, 91)
        for text in (f"Waiting for child process [{pid}]", f"Child process [{pid}] died")
    ]
    started = [worker_start(version, pid) for pid in (11, 12, 13)]
    lines = [start, *log[1:], *started, *killed, f"{LOG_PREFIX}a request"]
    run = run_release(tmp_path, docs, version, lines)
    assert run.status == 1, run.out + run.err
    report = run.report
    assert report["data"]["http_workers"] == {
        "asked": 4, "serving": 3, "started": [11, 12, 13], "killed": [90, 91], "killed_after_ready": 2, "ready": True,
    }  # fmt: skip
    problem = next(p for p in report["problems"] if p.startswith("HTTP processes:"))
    assert "killed 2 after the server was ready" in problem and "3 of the 4 launched serve" in problem
    assert "SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT=120" in problem
    assert report["degraded"] == []  # the expectations themselves were met
    text = verify("--log", write_log(tmp_path, lines), "--launch-command", launch_file(tmp_path))
    assert text.status == 1 and text.out.rstrip().endswith("the server lost HTTP processes while it served")


@pytest.mark.slow
def test_workers_replaced_while_the_server_started_are_a_note(tmp_path: Path, docs: Docs) -> None:
    version = "0.5.16"
    log = healthy_log(version)
    start = log[0] + " tokenizer_worker_num=2"
    early = [f"{LOG_PREFIX}INFO:     Waiting for child process [7]", f"{LOG_PREFIX}INFO:     Child process [7] died"]
    lines = [start, *early, *log[1:-1], worker_start(version, 8), worker_start(version, 9), log[-1]]
    run = run_release(tmp_path, docs, version, lines)
    assert run.status == 0, run.out + run.err
    assert (
        "HTTP processes: 2 launched, 2 serving; uvicorn's health check killed 1 while the server started"
        in (run.report["notes"])
    )
