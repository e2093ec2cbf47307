"""`sm120check bench`: sweep fixed concurrency levels against a live server and append one JSONL record per level."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import math
import os
import socket
import sys
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sm120check import __version__
from sm120check.bench.apis import Api, RequestSpec
from sm120check.bench.http import Connection, Endpoint, HttpError, has_credentials, redact_url
from sm120check.bench.prompts import load_prompt_file, synthetic_prompts
from sm120check.bench.records import LevelSummary, append_jsonl, seed_table
from sm120check.bench.runner import LevelPlan, run_level, summarize

DEFAULT_LEVELS = "1,2,5,10,30,70,100,250"
API_KEY_ENV = "OPENAI_API_KEY"
_SERVER_KEYS = (
    "model_path",
    "version",
    "tp_size",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_adaptive",
    "enable_flashinfer_allreduce_fusion",
    "enable_torch_symm_mem",
    "max_running_requests",
    "sim_model",
)


MAX_CONCURRENCY = 4096  # each in-flight request is one connection and one task on this client


def parse_levels(text: str) -> list[int]:
    levels: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) < 1:
            raise argparse.ArgumentTypeError(f"concurrency {part!r} is not a positive integer (e.g. 1,2,5,10)")
        if int(part) > MAX_CONCURRENCY:
            raise argparse.ArgumentTypeError(
                f"concurrency {part} is above the maximum {MAX_CONCURRENCY}: each in-flight request holds one "
                "connection and one task on this client; measure higher loads with several clients"
            )
        if int(part) not in levels:
            levels.append(int(part))
    if not levels:
        raise argparse.ArgumentTypeError("no concurrency levels given (e.g. --concurrency 1,2,5,10)")
    return levels


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "bench",
        help="sweep concurrency levels against a live server (JSONL per level)",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--api", choices=[a.value for a in Api], default=Api.SGLANG.value, help="request shape")
    p.add_argument("--concurrency", type=parse_levels, default=DEFAULT_LEVELS, help="comma-separated levels")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument(
        "--requests-per-level", type=_positive_int, help="measured requests per level (default: 2*C, at least 8)"
    )
    amount.add_argument("--duration", type=_positive_float, help="seconds of steady window per level instead")
    p.add_argument("--warmup", type=int, default=1, help="warm-up requests per worker before measuring")
    p.add_argument("--input-len", type=_positive_int, default=256, help="synthetic prompt length in words")
    p.add_argument("--output-len", type=_positive_int, default=256, help="output tokens per request")
    p.add_argument("--temperature", type=_temperature, default=0.0, help="sampling temperature (>= 0)")
    p.add_argument("--no-ignore-eos", action="store_true", help="let requests stop at EOS (variable lengths)")
    p.add_argument("--prompt-file", type=Path, help="prompts, one per line or JSONL with a prompt field")
    p.add_argument("--model", help="model name for OpenAI APIs (default: the first of /v1/models)")
    # The default is read at run time, never at parse time: a default is printed by --help. `%(default).0s` prints
    # nothing, and stops ArgumentDefaultsHelpFormatter from appending "(default: ...)".
    p.add_argument(
        "--api-key", default=None, help=f"bearer token (default: ${API_KEY_ENV}, read at run time)%(default).0s"
    )
    p.add_argument("--label", default="", help="sweep label, e.g. base or spec")
    p.add_argument("--out", type=Path, help="append one JSONL record per level here")
    p.add_argument("--request-timeout", type=_positive_float, default=600.0, help="seconds per request")
    p.add_argument("--level-timeout", type=_positive_float, default=3600.0, help="seconds per level")
    p.add_argument(
        "--info-timeout",
        type=_positive_float,
        default=30.0,
        help="seconds for each request outside the levels (/get_server_info, /v1/models), connect to last byte",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for synthetic prompts")
    p.add_argument("--json", action="store_true", help="print the level records as JSON lines, not a table")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(handler=handle)


class SweepError(Exception):
    """The sweep stopped early (the message says why and names the URL or the file); `records_kept` tells whether
    every finished level is in --out."""

    def __init__(self, message: str, records_kept: bool = True) -> None:
        super().__init__(message)
        self.records_kept = records_kept


def handle(args: argparse.Namespace) -> int:
    levels: list[int] = parse_levels(args.concurrency) if isinstance(args.concurrency, str) else args.concurrency
    try:
        endpoint = Endpoint.parse(args.url)
        prompts = load_prompt_file(args.prompt_file) if args.prompt_file else None
    except ValueError as exc:
        print(f"sm120check bench: {exc}", file=sys.stderr)
        return 2
    if args.warmup < 0:
        print(f"sm120check bench: --warmup {args.warmup} must be 0 or more", file=sys.stderr)
        return 2
    if has_credentials(args.url):
        print(
            f"sm120check bench: warning: the user and password in --url are not sent and not recorded "
            f"(benchmarking {endpoint}); use --api-key or ${API_KEY_ENV} for a bearer token",
            file=sys.stderr,
        )
    if args.out is not None and (problem := _out_problem(args.out)):
        print(f"sm120check bench: --out {args.out}: {problem}; nothing was sent to the server", file=sys.stderr)
        return 2
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    code, kept = 0, bool(args.out)
    summaries: list[LevelSummary] = []
    try:
        asyncio.run(_sweep(args, endpoint, levels, prompts, api_key, summaries))
    except HttpError as exc:
        print(f"sm120check bench: {exc}\n  is the server up? check {endpoint}/health", file=sys.stderr)
        code = 1
    except SweepError as exc:
        print(f"sm120check bench: {exc}", file=sys.stderr)
        code, kept = 1, kept and exc.records_kept
    if code and summaries:
        kept_where = f"; their records are in {args.out}" if kept else ""
        print(f"sm120check bench: {len(summaries)} level(s) finished before it stopped{kept_where}", file=sys.stderr)
    if code and not summaries:
        return code
    if args.json:
        for s in summaries:
            print(s.to_jsonl_line())
    else:
        print(seed_table(summaries))
    failed = sum(s.errors for s in summaries)
    if failed:
        print(f"sm120check bench: {failed} requests failed; see error_samples in the records", file=sys.stderr)
    return 1 if failed or code else 0


def _out_problem(path: Path) -> str:
    """Why --out cannot take the records ("" when it can), found before any load is sent: the file is opened for
    append (and removed again when this made it), so a directory, a missing permission or a read-only file system
    is reported now, not after the first level."""
    if path.is_dir():
        return "is a directory; give a file such as results.jsonl"
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        return f"cannot be written: {exc.strerror or exc}"
    if not existed:
        path.unlink(missing_ok=True)
    return ""


async def _sweep(
    args: argparse.Namespace,
    endpoint: Endpoint,
    levels: Sequence[int],
    prompts: list[str] | None,
    api_key: str | None,
    summaries: list[LevelSummary],
) -> None:
    """Run every level, appending each finished level to `summaries` (and to --out) as soon as it is measured."""
    api = Api(args.api)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    info_timeout: float = getattr(args, "info_timeout", 30.0)

    def say(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    server = await fetch_server_info(endpoint, headers, info_timeout)
    model = args.model or ""
    if api is not Api.SGLANG and not model:
        model = await fetch_model_name(endpoint, headers, info_timeout)
    run_id = uuid.uuid4().hex[:12]
    recorded = {k: v for k, v in vars(args).items() if k not in ("handler", "api_key", "command")}
    recorded["url"] = redact_url(args.url)
    meta: dict[str, Any] = {
        "api": api.value,
        "url": str(endpoint),
        "model": model or server.get("model_path", ""),
        "server": {k: server[k] for k in _SERVER_KEYS if k in server},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in recorded.items()},
        "client": {"host": socket.gethostname(), "sm120check": __version__},
    }
    pool = prompts or synthetic_prompts(max(4 * max(levels), 64), args.input_len, args.seed)
    for c in levels:
        if args.duration is not None:
            plan = LevelPlan(c, duration=args.duration, warmup=args.warmup)
        else:
            plan = LevelPlan(c, requests=args.requests_per_level or max(2 * c, 8), warmup=args.warmup)
        plan = replace(plan, request_timeout=args.request_timeout, level_timeout=args.level_timeout)
        say(f"C={c}: {plan.requests or f'{plan.duration:g} s of'} measured requests after {args.warmup} warm-up each")

        def make_spec(i: int) -> RequestSpec:
            return RequestSpec(pool[i % len(pool)], args.output_len, args.temperature, not args.no_ignore_eos, model)

        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        records, t0, t1, timed_out = await run_level(endpoint, api, plan, make_spec, headers, say)
        summary = summarize(c, records, t0, t1, timed_out)
        stalled: HttpError | None = None
        try:
            after = await fetch_server_info(endpoint, headers, info_timeout)
        except HttpError as exc:  # the level is measured: keep it, then stop
            after, stalled = {}, exc
            summary = replace(summary, warnings=(*summary.warnings, f"server info after the level: {exc}"))
        server_accept, accept_problem = _server_accept_length(after)
        if accept_problem:
            summary = replace(
                summary,
                warnings=(*summary.warnings, f"{accept_problem}; not used"),
                flags=(*summary.flags, "untrusted_server_accept_length"),
            )
        if summary.accept_length is None and server_accept is not None:
            summary = replace(summary, accept_length=server_accept, accept_source="get_server_info")
        level_meta = dict(meta, started_at=started, server_accept_length=server_accept)
        summary = replace(summary, label=args.label, run_id=run_id, meta=level_meta)
        summaries.append(summary)
        if args.out:
            try:
                append_jsonl(args.out, [summary])
            except OSError as exc:  # checked up front; this is a disk that filled or went away during the sweep
                message = f"cannot append the C={c} record to {args.out}: {exc.strerror or exc}"
                raise SweepError(message, records_kept=False) from None
        accept = f", accept length {summary.accept_length:.2f}" if summary.accept_length else ""
        say(
            f"C={c}: {summary.throughput_tok_s:.1f} tok/s, {summary.per_request_mean:.1f} tok/s per request, "
            f"{summary.errors}/{summary.requests} errors{accept}"
        )
        for warning in summary.warnings:
            say(f"  warning: {warning}")
        if stalled is not None:
            raise SweepError(f"stopped after C={c}: {stalled}")


async def _bounded_get_json(conn: Connection, path: str, timeout: float) -> object:
    """GET path, bounded from connect to the last body byte: a stalled server is an HttpError naming the URL."""
    try:
        return await asyncio.wait_for(conn.get_json(path), timeout)
    except asyncio.TimeoutError:
        await conn.close()
        raise HttpError(
            f"GET {conn.endpoint}{path}: no complete response within {timeout:g} s (the server stalled; "
            "--info-timeout sets the limit)"
        ) from None


async def fetch_server_info(endpoint: Endpoint, headers: dict[str, str], timeout: float = 30.0) -> dict[str, Any]:
    """SGLang's /get_server_info (or /server_info); {} for servers without it. Connection failures and stalls
    (no complete answer within `timeout` seconds) raise HttpError."""
    conn = Connection(endpoint, headers, connect_timeout=min(timeout, 10.0))
    try:
        for path in ("/get_server_info", "/server_info"):
            try:
                info = await _bounded_get_json(conn, path, timeout)
            except HttpError as exc:
                if "HTTP" not in str(exc) or "stalled" in str(exc):
                    raise
                continue
            if isinstance(info, dict):
                return info
        return {}
    finally:
        await conn.close()


async def fetch_model_name(endpoint: Endpoint, headers: dict[str, str], timeout: float = 30.0) -> str:
    conn = Connection(endpoint, headers, connect_timeout=min(timeout, 10.0))
    try:
        data = await _bounded_get_json(conn, "/v1/models", timeout)
    except HttpError as exc:
        raise HttpError(f"{exc}; pass --model NAME") from None
    finally:
        await conn.close()
    models = data.get("data") if isinstance(data, dict) else None
    if isinstance(models, list) and models and isinstance(models[0], dict) and "id" in models[0]:
        return str(models[0]["id"])
    raise HttpError("GET /v1/models listed no model; pass --model NAME")


def _server_accept_length(info: dict[str, Any]) -> tuple[float | None, str]:
    """The accept length /get_server_info reports, and why a reported one cannot be used ("" when fine)."""
    states = info.get("internal_states")
    candidates: list[object] = []
    if isinstance(states, list) and states and isinstance(states[0], dict):
        candidates.append(states[0].get("avg_spec_accept_length"))
    candidates.append(info.get("avg_spec_accept_length"))
    problem = ""
    for value in candidates:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value) or value < 0:
            problem = problem or f"the server reported avg_spec_accept_length {value}, which cannot be true"
            continue
        if value > 0:
            return float(value), problem
    return None, problem
