"""`bench` against a stalling server and with secrets or a bad --out (reliability probe items 5, 8, 12: B5, B16,
B17, B21, B22): every network call is bounded and a stall names the URL with the finished levels kept; no secret
reaches --help or the records; --out is checked before any load is sent."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.conftest import run_subcommand
from lab.loopback import QuietHandler, serve, sse, url
from sm120check.cli import main


@dataclass
class StallServer:
    """/generate streams a short SGLang answer; /get_server_info answers `answer_info` times, then stalls (it
    accepts, sends nothing, and holds the connection until the test ends)."""

    answer_info: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    paths: list[str] = field(default_factory=list)
    url: str = ""


@contextlib.contextmanager
def stall_server(answer_info: int) -> Iterator[StallServer]:
    state = StallServer(answer_info)

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            state.paths.append(self.path)
            if self.path in ("/get_server_info", "/server_info"):
                if state.answer_info <= 0:
                    state.release.wait(60)  # the stall: bounded only so the test's threads end
                    return
                state.answer_info -= 1
                self.send(200, "application/json", b'{"version": "stall-test"}')
                return
            self.send(404, "application/json", b"{}")

        def do_POST(self) -> None:
            state.paths.append(self.path)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            events = [
                {"text": " tok" * n, "meta_info": {"completion_tokens": n, "finish_reason": None}} for n in (1, 2, 3)
            ]
            events[-1]["meta_info"]["finish_reason"] = {"type": "length", "length": 3}  # type: ignore[index]
            self.send(200, "text/event-stream", sse(events))

    with serve(Handler) as server:
        state.url = url(server)
        try:
            yield state
        finally:
            state.release.set()


def bench(url: str, *extra: str) -> int:
    return run_subcommand(
        "bench", "--url", url, "--concurrency", "1", "--requests-per-level", "2", "--warmup", "0",
        "--output-len", "3", "--quiet", "--info-timeout", "1", "--request-timeout", "10", "--level-timeout", "20",
        *extra,
    )  # fmt: skip


# --- B5: a stall on /get_server_info is bounded and named ---


@pytest.mark.timeout(60)
def test_a_stall_before_the_first_level_is_bounded_and_names_the_url(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with stall_server(answer_info=0) as server:
        code = bench(server.url, "--out", str(tmp_path / "r.jsonl"))
    err = capsys.readouterr().err
    assert code == 2  # nothing measured: the bench could not do its job
    assert f"GET {server.url}/get_server_info" in err and "stalled" in err
    assert not any(p.startswith("/generate") for p in server.paths)  # no load after the stall


@pytest.mark.timeout(60)
def test_a_stall_after_a_level_keeps_the_finished_level(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    with stall_server(answer_info=1) as server:
        code = run_subcommand(
            "bench", "--url", server.url, "--concurrency", "1,2", "--requests-per-level", "2", "--warmup", "0",
            "--output-len", "3", "--quiet", "--info-timeout", "1", "--out", str(out), "--json",
        )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 1
    assert f"GET {server.url}/get_server_info" in captured.err and "stopped after C=1" in captured.err
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["concurrency"] for r in records] == [1]  # the measured level is kept, C=2 never ran
    assert records[0]["errors"] == 0
    assert any("server info after the level" in w for w in records[0]["warnings"])
    assert [json.loads(line)["concurrency"] for line in captured.out.splitlines() if line.strip()] == [1]


# --- B22: --help never shows the API key ---


def test_help_does_not_print_the_api_key(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-HELP-LEAK-999")
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = "".join(capsys.readouterr().out.split())  # argparse wraps long defaults, at hyphens too
    assert "--api-key" in text and "OPENAI_API_KEY" in text
    assert "LEAK-999" not in text


def test_the_api_key_from_the_environment_is_still_sent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-RUNTIME-123")
    seen: list[str] = []

    async def fake_info(endpoint: object, headers: dict[str, str], timeout: float = 30.0) -> dict[str, object]:
        seen.append(headers.get("Authorization", ""))
        raise __import__("sm120check.bench.http", fromlist=["HttpError"]).HttpError("stop here")

    monkeypatch.setattr("sm120check.bench.cli.fetch_server_info", fake_info)
    assert run_subcommand("bench", "--url", "http://127.0.0.1:9", "--quiet") == 2
    assert seen == ["Bearer sk-RUNTIME-123"]


# --- B21: credentials in --url are never written ---


@pytest.mark.timeout(60)
def test_credentials_in_the_url_are_not_written_anywhere(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    with stall_server(answer_info=100) as server:
        secret_url = server.url.replace("http://", "http://admin:hunter2@") + "/"
        code = bench(secret_url, "--out", str(out), "--json")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    text = out.read_text(encoding="utf-8")
    assert text.strip()
    for written in (text, captured.out, captured.err):
        assert "hunter2" not in written and "admin:" not in written
    assert json.loads(text.splitlines()[0])["args"]["url"] == server.url + "/"


# --- B16, B17: --out is checked before any load is sent ---


@pytest.mark.parametrize("kind", ["directory", "parent-is-a-file", "missing-permission"])
def test_an_unwritable_out_is_refused_before_any_load(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if kind == "directory":
        out = tmp_path / "adir"
        out.mkdir()
    elif kind == "parent-is-a-file":
        (tmp_path / "plain").write_text("", encoding="utf-8")
        out = tmp_path / "plain" / "r.jsonl"
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        out = locked / "r.jsonl"
        out.write_text("", encoding="utf-8")
        out.chmod(0o444)
        with contextlib.suppress(OSError), out.open("a"):
            pytest.skip("running as a user that ignores file permissions (root)")
    with stall_server(answer_info=100) as server:
        code = bench(server.url, "--out", str(out))
    err = capsys.readouterr().err
    assert code == 2
    assert f"--out {out}" in err
    assert server.paths == []  # nothing was sent, not even /get_server_info
