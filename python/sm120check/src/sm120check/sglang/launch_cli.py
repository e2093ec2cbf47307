"""`sm120check sglang verify-launch`: prove that a started SGLang server runs what its launch asked for.

Reads the server's log (a file, or the journal of its systemd unit) and its /server_info, and gives each expectation
(fusion, symm-mem, speculative, adaptive, cuda-graph) a verdict: ok, degraded or unknown, with the evidence (the log
line or the server_args field) and the fix. Exit 0 when nothing is degraded, 1 when something is, 2 when an input
cannot be read (bad URL, unreadable log, server unreachable within the bound, a server_info that is not one).

This module does the reading (files, the journal, HTTP); the logic is pure, one module per input, each depending only
on those before it: launch_terms.py (shared terms), launch_patterns.py (the table of SGLang's log lines),
launch_request.py (the launch command), server_info.py (/server_info), startup_log.py (the log scan),
launch_verdict.py (the verdicts), launch_report.py (exit code, JSON, text).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import http.client
import json
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from sm120check import argtypes, bounded
from sm120check.exitcodes import Exit
from sm120check.sglang import allreduce_backend, http_workers, plain_decode
from sm120check.sglang.launch_report import SCHEMA, exit_code, render, to_dict
from sm120check.sglang.launch_request import LaunchRequest, parse_expect, request_from_argv, request_from_command
from sm120check.sglang.launch_terms import Expectation, LaunchError, printable
from sm120check.sglang.launch_verdict import LaunchReport, judge
from sm120check.sglang.server_info import MAX_SERVER_INFO_BYTES, ServerInfo, parse_server_info
from sm120check.sglang.startup_log import scan_log

MAX_LAUNCH_COMMAND_BYTES = 1 << 20
JOURNAL_TIMEOUT_S = 30.0
_UNIT = re.compile(r"[A-Za-z0-9:_.@\\-]{1,256}")
_READ = 1 << 16


MAX_LOG_MIB = 1024
MAX_RETRIES = 100
_timeout = argtypes.real(0, 3600, unit="of seconds", low_open=True)
_retries = argtypes.whole(1, MAX_RETRIES, unit="of attempts")
_log_mib = argtypes.real(0, MAX_LOG_MIB, unit="of MiB", low_open=True)


class VerifyError(Exception):
    """An input that could not be read; the message names the value and what to do."""


def register(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = actions.add_parser(
        "verify-launch",
        help="check that the running server runs what its launch asked for (fusion, symm mem, speculation, graphs)",
        description=(__doc__ or "").split("\n\nThis module", 1)[0],  # the user's part; the rest is for maintainers
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument("--log", metavar="FILE", type=Path, help="the server's log file (its last --max-log-mib read)")
    source.add_argument(
        "--journal-unit",
        metavar="NAME",
        help="read the log from `journalctl -u NAME -b` (the sglang_server role runs SGLang as this systemd unit)",
    )
    p.add_argument("--url", metavar="URL", help="the server, e.g. http://127.0.0.1:30000 (reads /server_info)")
    asked = p.add_mutually_exclusive_group()
    asked.add_argument(
        "--launch-command",
        metavar="FILE",
        type=Path,
        help="the launch command the server was started with (the role's launch-command.txt); sets the expectations",
    )
    asked.add_argument(
        "--expect",
        metavar="LIST",
        help=f"comma-separated expectations instead: {','.join(e.value for e in Expectation)}",
    )
    p.add_argument("--sglang-version", metavar="VER", help="the SGLang release (default: server_info's version)")
    p.add_argument("--timeout", metavar="S", type=_timeout, default=10.0, help="seconds per HTTP attempt (default 10)")
    p.add_argument("--retries", metavar="N", type=_retries, default=3, help="HTTP attempts in all (default 3)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("SGLANG_API_KEY"),
        help="bearer token when the server runs with --api-key ($SGLANG_API_KEY); never printed",
    )
    p.add_argument(
        "--max-log-mib",
        metavar="N",
        type=_log_mib,
        default=16.0,
        help=f"read at most the last N MiB of log (at most {MAX_LOG_MIB}: it is held in memory)",
    )
    p.add_argument(
        "--plain-decode-min-bs",
        metavar="N",
        type=argtypes.whole(1, 1 << 20, unit="of requests"),
        help="the speculation switch's threshold the server was started with: exit 1 when its log lacks the switch, "
        "or shows plain batches below N or speculative ones at N or more",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 when a verdict is unknown, too")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


# --- URL -----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    prefix: str
    auth: str | None  # "user:password" from the URL, sent as Basic auth, never shown

    @property
    def shown(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.prefix}"


def redact_url(url: str) -> str:
    """The URL with any user:password@ and query removed: what output may show."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc.rpartition("@")[2]
    except ValueError:
        return "<unparsable URL>"
    return printable(f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme else netloc or url.rpartition("@")[2])


def parse_url(url: str) -> Endpoint:
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise VerifyError(f"--url {shown!r} is not a URL ({exc}); give one like http://127.0.0.1:30000") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise VerifyError(f"--url {shown!r} is not an http(s) URL; give one like http://127.0.0.1:30000")
    auth = None
    if parts.username is not None:
        auth = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    default = 443 if parts.scheme == "https" else 80
    return Endpoint(parts.scheme, parts.hostname, port or default, parts.path.rstrip("/"), auth)


def _get(endpoint: Endpoint, path: str, timeout: float, api_key: str | None) -> tuple[int, bytes]:
    cls = http.client.HTTPSConnection if endpoint.scheme == "https" else http.client.HTTPConnection
    conn = cls(endpoint.host, endpoint.port, timeout=timeout)
    headers = {"Accept": "application/json", "Connection": "close"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    elif endpoint.auth:
        headers["Authorization"] = "Basic " + base64.b64encode(endpoint.auth.encode()).decode()
    deadline = time.monotonic() + timeout
    try:
        conn.request("GET", endpoint.prefix + path, headers=headers)
        response = conn.getresponse()
        body = bytearray()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the body did not arrive in time")
            if conn.sock is not None:
                conn.sock.settimeout(remaining)
            chunk = response.read(_READ)
            if not chunk:
                break
            body += chunk
            if len(body) > MAX_SERVER_INFO_BYTES:
                raise LaunchError(
                    f"server_info from {endpoint.shown}{path} is larger than {MAX_SERVER_INFO_BYTES} bytes; "
                    "refusing to read more"
                )
        return response.status, bytes(body)
    finally:
        conn.close()


def _attempt(endpoint: Endpoint, path: str, timeout: float, api_key: str | None) -> tuple[int, bytes]:
    """One GET, bounded in wall time even against a server that trickles bytes (the worker thread is abandoned)."""
    result: list[tuple[int, bytes]] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            result.append(_get(endpoint, path, timeout, api_key))
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    worker = threading.Thread(target=work, name="verify-launch-http", daemon=True)
    worker.start()
    worker.join(timeout + 1.0)
    if failure:
        raise failure[0]
    if not result:
        raise TimeoutError("no complete answer in time")
    return result[0]


def fetch_server_info(endpoint: Endpoint, timeout: float, retries: int, api_key: str | None) -> bytes:
    """GET /server_info (then /get_server_info, the older name); retries connection failures and 5xx."""
    attempts = max(1, retries)
    last = ""
    for attempt in range(attempts):
        if attempt:
            time.sleep(min(1.0, timeout))
        for path in ("/server_info", "/get_server_info"):
            try:
                status, body = _attempt(endpoint, path, timeout, api_key)
            except LaunchError as exc:
                raise VerifyError(str(exc)) from None
            except (OSError, http.client.HTTPException) as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                break
            if status == 200:
                return body
            if status == 404:
                last = f"HTTP 404 on {path}"
                continue
            if status in (401, 403):
                raise VerifyError(
                    f"{endpoint.shown}{path} answered HTTP {status}: the server wants its API key (--api-key or "
                    "$SGLANG_API_KEY)"
                )
            last = f"HTTP {status} on {path}"
            if status < 500:
                raise VerifyError(f"{endpoint.shown}{path} answered {last}; is this an SGLang server?")
            break
    raise VerifyError(
        f"no server_info from {endpoint.shown} within {timeout:g} s x {attempts} attempt(s) "
        f"({printable(last)}); is the server up at that address?"
    )


# --- the log -------------------------------------------------------------------------------------------------------


def _decode(data: bytes, truncated: bool) -> list[str]:
    if truncated:
        cut = data.find(b"\n")
        data = data[cut + 1 :] if cut >= 0 else b""
    return data.decode("utf-8", "replace").splitlines()


def check_log_file(path: Path) -> None:
    """Raise VerifyError naming the log when it cannot be read (a FIFO or device would block or never end)."""
    try:
        os.close(bounded.open_regular(path))
    except bounded.Unreadable as exc:
        raise VerifyError(f"--log {exc}; give the server's log file, or --journal-unit NAME") from None


def read_log_file(path: Path, cap: int) -> tuple[list[str], bool]:
    """The newest `cap` bytes of the log, as lines, and whether older ones were cut."""
    try:
        data, truncated = bounded.read_tail(path, cap)
    except bounded.Unreadable as exc:
        raise VerifyError(f"--log {exc}; give the server's log file, or --journal-unit NAME") from None
    return _decode(data, truncated), truncated


def read_journal(unit: str, cap: int, timeout: float | None = None) -> tuple[list[str], bool]:
    """The last `cap` bytes of `journalctl -u UNIT -b` (this boot, every run of the unit), bounded in time."""
    limit = JOURNAL_TIMEOUT_S if timeout is None else timeout
    if not _UNIT.fullmatch(unit) or unit.startswith("-"):
        raise VerifyError(f"--journal-unit {printable(unit)!r} is not a systemd unit name")
    journalctl = shutil.which("journalctl")
    if journalctl is None:
        raise VerifyError("journalctl is not on PATH: pass the server's log file with --log FILE")
    argv = [journalctl, "-u", unit, "-b", "--no-pager", "-q", "-o", "cat"]
    try:
        out = bounded.command_output(argv, cap, limit)
    except OSError as exc:
        raise VerifyError(f"cannot run journalctl: {exc}") from None
    if out.timed_out:
        raise VerifyError(f"journalctl -u {unit} did not finish within {limit:g} s")
    if out.returncode != 0:
        message = out.stderr.strip()
        first = message.splitlines()[0] if message else "no message"
        raise VerifyError(f"journalctl -u {unit} failed (exit {out.returncode}): {printable(first)}")
    return _decode(out.data, out.cut), out.cut


# --- the command ---------------------------------------------------------------------------------------------------


def _read_launch_command(path: Path) -> str:
    try:
        data = bounded.read_bytes(path, MAX_LAUNCH_COMMAND_BYTES)
    except bounded.TooLarge as exc:
        raise VerifyError(f"--launch-command {exc}, not a command line") from None
    except bounded.Unreadable as exc:
        raise VerifyError(f"--launch-command {exc}; give the launch-command.txt the sglang_server role wrote") from None
    return data.decode("utf-8", "replace")


def _request(args: argparse.Namespace, info: ServerInfo | None) -> LaunchRequest:
    if args.expect is not None:
        return LaunchRequest(parse_expect(args.expect), "--expect")
    if args.launch_command is not None:
        origin = f"--launch-command {args.launch_command}"
        return request_from_command(_read_launch_command(args.launch_command), origin)
    if info is not None and info.launch_command:
        return request_from_argv(["sglang", *info.launch_command.split()], "server_info launch_command")
    raise VerifyError(
        "say what the launch asked for: --launch-command FILE (the sglang_server role writes launch-command.txt) "
        "or --expect LIST"
    )


def verify(args: argparse.Namespace) -> LaunchReport:
    if args.log is None and args.journal_unit is None and args.url is None:
        raise VerifyError("nothing to verify against: give --log FILE or --journal-unit NAME, and/or --url URL")
    for name, parse in (("timeout", _timeout), ("retries", _retries), ("max_log_mib", _log_mib)):
        try:  # the parser checked them; a Namespace built by a caller gets the same check
            parse(str(getattr(args, name)))
        except argparse.ArgumentTypeError as exc:
            raise VerifyError(f"--{name.replace('_', '-')} {exc}") from None
    if args.expect is not None:
        parse_expect(args.expect)  # a usage error before any I/O
    endpoint = parse_url(args.url) if args.url else None
    if args.log is not None:
        check_log_file(args.log)  # name a missing or odd log before waiting on the server
    info = None
    if endpoint is not None:  # first: a server that answers has written every startup line before the log is read
        info = parse_server_info(fetch_server_info(endpoint, args.timeout, args.retries, args.api_key))
    cap = int(args.max_log_mib * (1 << 20))
    scan = None
    lines: list[str] = []
    if args.log is not None:
        lines, truncated = read_log_file(args.log, cap)
        scan = scan_log(lines, f"--log {args.log}", truncated)
    elif args.journal_unit is not None:
        lines, truncated = read_journal(args.journal_unit, cap)
        scan = scan_log(lines, f"journal of unit {args.journal_unit}", truncated)
    request = _request(args, info)
    if args.sglang_version:
        version, origin = args.sglang_version, "--sglang-version"
    elif info is not None and info.version:
        version, origin = info.version, "server_info"
    else:
        version, origin = None, ""
    report = judge(request, info, scan, version, origin, endpoint.shown if endpoint else None)
    if scan is not None:
        backend = allreduce_backend.scan(lines, scan.start_line or 1, report.log_complete)
        report = dataclasses.replace(report, allreduce=backend, notes=(*report.notes, backend.note))
    workers = http_workers.scan(lines)
    if workers is not None:
        report = dataclasses.replace(report, http_workers=workers, notes=(*report.notes, workers.note))
    switch = plain_decode.evidence(lines)
    min_bs = getattr(args, "plain_decode_min_bs", None)
    if switch is None and min_bs is not None and scan is not None:
        switch = plain_decode.SwitchEvidence(False, 0, {}, {})
    if switch is None:
        return report
    problem = switch.against(min_bs) if min_bs is not None else ""
    return dataclasses.replace(report, switch=switch, notes=(*report.notes, switch.note), switch_problem=problem)


def run(args: argparse.Namespace) -> int:
    try:
        report = verify(args)
    except (VerifyError, LaunchError) as exc:
        message = printable(str(exc))
        if args.json:
            print(json.dumps({"schema": SCHEMA, "error": message, "lines": [], "problems": [message], "notes": []}))
        print(f"sm120check sglang verify-launch: {message}", file=sys.stderr)
        return Exit.USAGE
    print(json.dumps(to_dict(report), indent=2) if args.json else render(report))
    return exit_code(report, args.strict)
