"""`sm120check bench`: sweep fixed concurrency levels against a live server and append one JSONL record per level."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import math
import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sm120check import __version__, argtypes, bounded
from sm120check.bench.apis import Api, RequestSpec
from sm120check.bench.arrivals import Arrivals
from sm120check.bench.closedloop import NO_NUMBERS, LevelPlan, RequestRecord, run_level, summarize
from sm120check.bench.datasets import FORMATS, DatasetError, load_dataset, parse_categories
from sm120check.bench.engines import (
    ServerFacts,
    bounded_get_json,
    cumulative_accept,
    discover,
    fetch_sglang_info,
    scrape_metrics,
)
from sm120check.bench.goodput import GoodputError, Slo, compute_goodput
from sm120check.bench.http import Connection, Endpoint, HttpError, has_credentials, redact_url
from sm120check.bench.identity import (
    CHANGED,
    META,
    SWEEP_CHANGED,
    LevelIdentity,
    ServerIdentity,
    change_message,
    fetch_identity,
    identity_from,
    level_name,
)
from sm120check.bench.metrics import Scrape, SpecFamily, family_for, forward_seconds, spec_delta
from sm120check.bench.openloop import HARD_MAX_IN_FLIGHT, OpenLoopStats, RatePlan, peak_in_flight, run_rate_level
from sm120check.bench.prompts import load_prompt_file, output_len, synthetic_prompts, unique_prompt
from sm120check.bench.records import LevelSummary, append_jsonl, level_table
from sm120check.bench.server_rate import GENERATION_COUNTERS, CounterSampler
from sm120check.bench.server_rate import judge as judge_window
from sm120check.bench.speculation import FLAG as DRAFT_FLAG
from sm120check.bench.speculation import draft_problem
from sm120check.exitcodes import Exit
from sm120check.safetext import terminal_text
from sm120check.sglang import plain_decode
from sm120check.sglang.allreduce_backend import BackendEvidence
from sm120check.sglang.allreduce_backend import scan as scan_backend
from sm120check.sglang.startup_log import scan_log

DEFAULT_LEVELS = "1,2,5,10,30,70,100,250"
API_KEY_ENV = "OPENAI_API_KEY"
IN_FLIGHT_WAIT_S = 5.0  # after a level, wait at most this long for the server's in-flight gauge to reach 0
fetch_server_info = fetch_sglang_info  # SGLang's /get_server_info; a name here so tests can stand in for it


def default_requests(concurrency: int) -> int:
    """Measured requests per level without --requests-per-level: 4 per worker keep the slope within ~2 %."""
    return max(4 * concurrency, 32)


MAX_CONCURRENCY = 4096  # each in-flight request is one connection and one task on this client


_level = argtypes.whole(
    1,
    MAX_CONCURRENCY,
    hint="each in-flight request holds one connection and one task here; measure higher loads with several clients",
)


def parse_levels(text: str) -> list[int]:
    levels: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = _level(part)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"concurrency {exc} (e.g. 1,2,5,10)") from None
        if value not in levels:
            levels.append(value)
    if not levels:
        raise argparse.ArgumentTypeError("no concurrency levels given (e.g. --concurrency 1,2,5,10)")
    return levels


# One range per kind of option, each through the shared parser (finite, in range; argtypes.py says why).
_timeout = argtypes.seconds
_duration = argtypes.real(0, argtypes.DAY_S, unit="of seconds", low_open=True)
_temperature = argtypes.real(0, 100, hint="0 is greedy")
_pause = argtypes.real(0, 3600, unit="of seconds")
_spread = argtypes.real(0, 1, high_open=True, hint="0 gives every request --output-len tokens")
_lifetimes = argtypes.real(1, 1000, unit="of request lifetimes")
_positive_int = argtypes.whole(1, 1 << 20)
_length = argtypes.whole(1, 1 << 20, unit="of words or tokens")
_warmup = argtypes.whole(0, 1 << 16, unit="of requests")
# Below 0.01/s a level of 32 arrivals outlasts the default level timeout of an hour; a rate of 1e-300 waited it out.
MIN_RATE = 0.01
_rate = argtypes.real(MIN_RATE, 1e6, unit="of requests per second", inf_means="all at once")
_burstiness = argtypes.real(
    0, 1000, low_open=True, inf_means="constant gaps", hint="1 = Poisson, below 1 burstier, above 1 more even"
)


def parse_rates(text: str) -> list[float]:
    """`--request-rate 1,2,4,inf`: offered requests per second, one open-loop level each."""
    rates: list[float] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = _rate(part)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"request rate {exc} (e.g. 1,2,4,8)") from None
        if value not in rates:
            rates.append(value)
    if not rates:
        raise argparse.ArgumentTypeError("no request rates given (e.g. --request-rate 1,2,4,8)")
    return rates


def _max_in_flight(text: str) -> int:
    value = _positive_int(text)
    if value > HARD_MAX_IN_FLIGHT:
        raise argparse.ArgumentTypeError(
            f"{value} is above {HARD_MAX_IN_FLIGHT} (one connection per request in flight)"
        )
    return value


def _slo(text: str) -> Slo:
    try:
        return Slo.parse(text)
    except GoodputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _categories(text: str) -> tuple[str, ...]:
    try:
        return parse_categories(text)
    except DatasetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def default_rate_requests(rate: float) -> int:
    """Measured arrivals per rate level without --requests-per-level: about 10 s of them, 32 to 4096."""
    return 32 if math.isinf(rate) else max(32, min(4096, math.ceil(10 * rate)))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "bench",
        help="sweep concurrency levels against a live server (JSONL per level)",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--api", choices=[a.value for a in Api], default=Api.SGLANG.value, help="request shape")
    p.add_argument(
        "--concurrency", type=parse_levels, help=f"comma-separated levels (closed loop; default {DEFAULT_LEVELS})"
    )
    p.add_argument(
        "--request-rate",
        type=parse_rates,
        help="open loop instead: comma-separated offered rates, requests/s (inf: all at once), one level each",
    )
    p.add_argument(
        "--burstiness", type=_burstiness, default=1.0, help="open loop: gamma shape of the arrival gaps; 1 = Poisson"
    )
    p.add_argument(
        "--max-in-flight",
        type=_max_in_flight,
        help="open loop: cap on requests in flight; later arrivals wait, and the wait counts in their latency",
    )
    p.add_argument("--slo", type=_slo, help="goodput SLOs in seconds, e.g. ttft=0.5,tpot=0.05,e2e=10")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument(
        "--requests-per-level",
        type=_positive_int,
        help="measured requests per level (default: 4*C, at least 32: fewer leave the slope uncertain)",
    )
    amount.add_argument("--duration", type=_duration, help="seconds of steady window per level instead")
    p.add_argument(
        "--min-lifetimes",
        type=_lifetimes,
        help="with --duration (closed loop): extend each level's window until it spans this many mean request "
        "lifetimes, within --level-timeout (20: the server's completion counter can confirm the throughput)",
    )
    p.add_argument(
        "--warmup",
        type=_warmup,
        help="warm-up requests per worker before measuring (default 1); open loop: arrivals (8)",
    )
    p.add_argument("--input-len", type=_length, default=256, help="synthetic prompt length in words")
    p.add_argument("--output-len", type=_length, default=256, help="output tokens per request")
    p.add_argument(
        "--output-len-spread",
        type=_spread,
        default=0.0,
        help="draw each request's output length uniformly from --output-len x (1 +- this fraction), the same draws "
        "for every server given the same --seed (default: 0, fixed lengths). Real traffic's lengths vary; fixed "
        "lengths make the requests that start together finish together, and a closed loop then refills in "
        "cohorts, which favours a server whose steps keep every request in step (the plain one)",
    )
    p.add_argument("--temperature", type=_temperature, default=0.0, help="sampling temperature (>= 0)")
    p.add_argument("--no-ignore-eos", action="store_true", help="let requests stop at EOS (variable lengths)")
    p.add_argument("--prompt-file", type=Path, help="prompts, one per line or JSONL with a prompt field")
    p.add_argument("--dataset", type=Path, help="prompts from a ShareGPT JSON or SPEED-Bench JSONL file")
    p.add_argument("--dataset-format", choices=FORMATS, default="auto", help="the --dataset file's format")
    p.add_argument("--category", type=_categories, help="--dataset categories to keep, comma-separated")
    p.add_argument(
        "--allow-prompt-reuse",
        action="store_true",
        help="send prompts as they are (no unique tag first, llama.cpp's prompt cache left on): cache hits likely",
    )
    p.add_argument(
        "--pause", type=_pause, default=1.0, help="seconds between levels, so a /metrics scraper can tell them apart"
    )
    p.add_argument(
        "--fresh-connections",
        action="store_true",
        help="open a new connection for every request instead of one keep-alive connection per worker. A server "
        "whose HTTP processes share one listening socket (SGLang's --tokenizer-worker-num, uvicorn workers) keeps "
        "each connection on the process that accepted it, and a level's burst of connects can fall very unevenly "
        "on them; fresh connections let the processes share the requests as they accept them",
    )
    p.add_argument("--model", help="model name for OpenAI APIs (default: the first of /v1/models)")
    # The default is read at run time, never at parse time: a default is printed by --help. `%(default).0s` prints
    # nothing, and stops ArgumentDefaultsHelpFormatter from appending "(default: ...)".
    p.add_argument(
        "--api-key", default=None, help=f"bearer token (default: ${API_KEY_ENV}, read at run time)%(default).0s"
    )
    p.add_argument("--label", default="", help="sweep label, e.g. base or spec")
    p.add_argument(
        "--out",
        type=Path,
        help="append one JSONL record per level here (default: a new bench-YYYYmmddTHHMMSS.jsonl in the current "
        "directory, named on stderr)",
    )
    p.add_argument("--request-timeout", type=_timeout, default=600.0, help="seconds per request")
    p.add_argument("--level-timeout", type=_timeout, default=3600.0, help="seconds per level")
    p.add_argument(
        "--info-timeout",
        type=_timeout,
        default=30.0,
        help="seconds for each request outside the levels (/get_server_info, /v1/models), connect to last byte",
    )
    p.add_argument(
        "--server-log",
        type=Path,
        metavar="FILE",
        help="the SGLang server's log file (its last 16 MiB): names the all-reduce backend the server used in every "
        "record (server_info does not show the SGLANG_ENABLE_PCIE_IPC_ALLREDUCE environment), and each level's "
        "decode batches the speculation switch ran plain and speculative per batch size",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for synthetic prompts")
    p.add_argument("--json", action="store_true", help="print the level records as JSON lines, not a table")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(handler=handle)


SERVER_LOST_FLAG = "server_lost_after_level"  # the server stalled or died as the level ended: the sweep stopped


SERVER_LOG_BYTES = 16 << 20


def read_log_backend(path: Path) -> BackendEvidence:
    """The all-reduce backend the last server run in an SGLang log used (its newest SERVER_LOG_BYTES read); the server
    answers the bench, so its startup is over and the log holds it whole when it holds the start."""
    data, truncated = bounded.read_tail(path, SERVER_LOG_BYTES)
    if truncated:
        cut = data.find(b"\n")
        data = data[cut + 1 :] if cut >= 0 else b""
    lines = data.decode("utf-8", "replace").splitlines()
    run = scan_log(lines, str(path), truncated)
    return scan_backend(lines, run.start_line or 1, run.complete(server_up=True))


class SweepError(Exception):
    """The sweep stopped early (the message says why and names the URL or the file); `records_kept` tells whether
    every finished level is in --out."""

    def __init__(self, message: str, records_kept: bool = True) -> None:
        super().__init__(message)
        self.records_kept = records_kept


class ApiMismatch(Exception):
    """--api names a request shape the server does not speak (found before any load)."""


def _usage_problem(args: argparse.Namespace) -> str:
    """Options that contradict each other ("" when none do)."""
    rates: list[float] | None = args.request_rate
    if rates is not None and args.concurrency is not None:
        return "give --concurrency (closed loop) or --request-rate (open loop), not both"
    if args.max_in_flight is not None and rates is None:
        return "--max-in-flight caps the open loop: give --request-rate too (the closed loop's cap is --concurrency)"
    if args.dataset is not None and args.prompt_file is not None:
        return "give --prompt-file or --dataset, not both"
    if args.category and args.dataset is None:
        return "--category selects rows of a --dataset file: give --dataset too"
    if args.min_lifetimes is not None and (args.duration is None or rates is not None):
        return (
            f"--min-lifetimes {args.min_lifetimes:g} extends a closed-loop --duration window: give --duration and "
            "--concurrency (not --request-rate)"
        )
    return ""


# Namespace entries that are not options of the run, or that a record must not keep (the bearer token).
_NOT_RECORDED = ("handler", "api_key", "command")


@dataclass(frozen=True)
class SweepConfig:
    """Every option of one `bench` run, read once from the command line (and what reading them needed: the prompts,
    the server log's backend, the bearer token)."""

    url: str
    endpoint: Endpoint
    api: Api
    levels: tuple[int, ...]  # closed loop: the concurrency levels
    rates: tuple[float, ...] | None  # open loop instead: the offered rates
    burstiness: float
    max_in_flight: int | None
    slo: Slo | None
    requests_per_level: int | None
    duration: float | None
    min_lifetimes: float | None
    warmup: int
    input_len: int
    output_len: int
    output_len_spread: float  # 0: every request asks for output_len tokens
    temperature: float
    ignore_eos: bool
    prompts: tuple[str, ...] | None  # None: synthetic prompts
    prompt_source: str  # "synthetic", "file:NAME" or "dataset:NAME:FORMAT[:CATEGORIES]"
    reuse_prompts: bool
    pause: float
    fresh_connections: bool  # a new connection for every request
    model: str  # "" when not given
    api_key: str | None
    label: str
    out: Path
    request_timeout: float
    level_timeout: float
    info_timeout: float
    server_log: Path | None
    log_backend: BackendEvidence | None
    seed: int
    json_lines: bool
    quiet: bool
    recorded_args: Mapping[str, object]  # the command line as every record keeps it (meta.args)

    @classmethod
    def from_args(
        cls,
        args: argparse.Namespace,
        *,
        endpoint: Endpoint,
        prompts: list[str] | None,
        warmup: int,
        out: Path,
        log_backend: BackendEvidence | None,
        api_key: str | None,
    ) -> SweepConfig:
        source = f"file:{args.prompt_file.name}" if args.prompt_file else "synthetic"
        if args.dataset is not None:
            categories = f":{','.join(args.category)}" if args.category else ""
            source = f"dataset:{args.dataset.name}:{args.dataset_format}{categories}"
        recorded = {k: v for k, v in vars(args).items() if k not in _NOT_RECORDED}
        recorded.update(warmup=warmup, out=out, url=redact_url(args.url))
        return cls(
            url=args.url,
            endpoint=endpoint,
            api=Api(args.api),
            levels=tuple(args.concurrency or parse_levels(DEFAULT_LEVELS)),
            rates=tuple(args.request_rate) if args.request_rate else None,
            burstiness=args.burstiness,
            max_in_flight=args.max_in_flight,
            slo=args.slo,
            requests_per_level=args.requests_per_level,
            duration=args.duration,
            min_lifetimes=args.min_lifetimes,
            warmup=warmup,
            input_len=args.input_len,
            output_len=args.output_len,
            output_len_spread=args.output_len_spread,
            temperature=args.temperature,
            ignore_eos=not args.no_ignore_eos,
            prompts=tuple(prompts) if prompts else None,
            prompt_source=source,
            reuse_prompts=args.allow_prompt_reuse,
            pause=args.pause,
            fresh_connections=args.fresh_connections,
            model=args.model or "",
            api_key=api_key,
            label=args.label,
            out=out,
            request_timeout=args.request_timeout,
            level_timeout=args.level_timeout,
            info_timeout=args.info_timeout,
            server_log=args.server_log,
            log_backend=log_backend,
            seed=args.seed,
            json_lines=args.json,
            quiet=args.quiet,
            recorded_args=recorded,
        )


def handle(args: argparse.Namespace) -> int:
    if usage := _usage_problem(args):
        print(f"sm120check bench: {usage}", file=sys.stderr)
        return Exit.USAGE
    warmup: int = args.warmup if args.warmup is not None else 1 if args.request_rate is None else 8
    try:
        endpoint = Endpoint.parse(args.url)
        prompts = load_prompt_file(args.prompt_file) if args.prompt_file else None
        if args.dataset is not None:
            dataset = load_dataset(args.dataset, args.dataset_format, args.category or ())
            prompts = [p.text for p in dataset.sample(len(dataset.prompts), args.seed)]
    except ValueError as exc:  # DatasetError is a ValueError
        print(f"sm120check bench: {terminal_text(exc)}", file=sys.stderr)
        return Exit.USAGE
    if warmup < 0:
        print(f"sm120check bench: --warmup {warmup} must be 0 or more", file=sys.stderr)
        return Exit.USAGE
    if has_credentials(args.url):
        print(
            f"sm120check bench: warning: the user and password in --url are not sent and not recorded "
            f"(benchmarking {endpoint}); use --api-key or ${API_KEY_ENV} for a bearer token",
            file=sys.stderr,
        )
    # the records are the result: without --out, keep them beside the run, under a name said on stderr
    out: Path = args.out if args.out is not None else default_out()
    if problem := _out_problem(out):
        print(f"sm120check bench: --out {out}: {problem}; nothing was sent to the server", file=sys.stderr)
        return Exit.USAGE
    log_backend = None
    if args.server_log is not None:
        try:
            log_backend = read_log_backend(args.server_log)
        except bounded.Unreadable as exc:
            print(
                f"sm120check bench: --server-log {terminal_text(exc)}; give the SGLang server's log file; nothing was "
                "sent to the server",
                file=sys.stderr,
            )
            return Exit.USAGE
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    config = SweepConfig.from_args(
        args, endpoint=endpoint, prompts=prompts, warmup=warmup, out=out, log_backend=log_backend, api_key=api_key
    )
    return _report(config, *_run_sweep(config))


def _run_sweep(config: SweepConfig) -> tuple[list[LevelSummary], int, bool]:
    """The sweep's level summaries, an exit status for a sweep that stopped early (OK when none) and whether every
    finished level's record is in --out; the reason it stopped is said on stderr."""
    code, kept = Exit.OK, True
    summaries: list[LevelSummary] = []
    try:
        asyncio.run(_sweep(config, summaries))
    except HttpError as exc:
        print(
            f"sm120check bench: {terminal_text(exc)}\n  is the server up? check {config.endpoint}/health",
            file=sys.stderr,
        )
        # No level measured: the bench could not do its job (exit 2); a server lost mid-sweep is a finding (1).
        code = Exit.FOUND if summaries else Exit.USAGE
    except ApiMismatch as exc:
        print(f"sm120check bench: {terminal_text(exc)}; nothing was sent to the server", file=sys.stderr)
        return summaries, Exit.USAGE, kept
    except SweepError as exc:
        print(f"sm120check bench: {terminal_text(exc)}", file=sys.stderr)
        code, kept = Exit.FOUND, exc.records_kept
    return summaries, code, kept


def _report(config: SweepConfig, summaries: list[LevelSummary], code: int, kept: bool) -> int:
    """The levels on stdout, what went wrong on stderr, and the exit status."""
    if code and summaries:
        kept_where = f"; their records are in {config.out}" if kept else ""
        print(f"sm120check bench: {len(summaries)} level(s) finished before it stopped{kept_where}", file=sys.stderr)
    if code and not summaries:
        return code
    if config.json_lines:
        for s in summaries:
            print(s.to_jsonl_line())
    else:
        print(level_table(summaries))
    print(f"sm120check bench: {len(summaries)} level record(s) appended to {config.out}", file=sys.stderr)
    failed = sum(s.errors for s in summaries)
    if failed:
        print(f"sm120check bench: {failed} requests failed; see error_samples in the records", file=sys.stderr)
    changed = [s for s in summaries if CHANGED in s.flags or SWEEP_CHANGED in s.flags]
    if changed:
        said = next((w for w in changed[0].warnings if w.startswith("the server changed")), "")
        print(
            f"sm120check bench: the server behind {config.endpoint} changed during the sweep (first at "
            f"{level_name(changed[0])}: {said}); the records are flagged and `crossover` refuses them: measure again "
            "against one server",
            file=sys.stderr,
        )
    empty = [s for s in summaries if NO_NUMBERS in s.flags]
    if empty and not failed:  # a record without a measurement is no success
        levels_named = ", ".join(
            f"rate {s.request_rate}/s" if s.mode == "open" else f"C={s.concurrency}" for s in empty
        )
        print(
            f"sm120check bench: {levels_named}: no measured request could be counted; see the warnings in the records",
            file=sys.stderr,
        )
    return Exit.FOUND if failed or code or empty or changed else Exit.OK


async def _identity(
    endpoint: Endpoint, headers: dict[str, str], facts: ServerFacts, timeout: float, info: dict[str, object] | None
) -> ServerIdentity | None:
    """The server's identity now: from SGLang's server info (`info` when already read), else the engine's route."""
    if facts.sglang_info:
        data = info if info is not None else await fetch_server_info(endpoint, headers, timeout)
        return identity_from("sglang", data)
    return await fetch_identity(endpoint, headers, facts.engine, timeout)


def _identity_flags(
    summary: LevelSummary, level: LevelIdentity, previous: ServerIdentity | None, first: ServerIdentity | None
) -> LevelSummary:
    """Flag a level whose server changed since the previous level's end or during it (CHANGED), and one whose server
    is not the sweep's first (SWEEP_CHANGED), with a warning naming both identities."""
    warnings, flags = list(summary.warnings), list(summary.flags)
    if previous is not None and level.start is not None and previous.changes(level.start):
        warnings.append(
            change_message(previous, level.start, "between the previous level's end and this level's start")
        )
    if level.start is not None and level.end is not None and level.start.changes(level.end):
        warnings.append(change_message(level.start, level.end, "during this level"))
    if len(warnings) > len(summary.warnings):
        flags.append(CHANGED)
    now = level.end or level.start
    if first is not None and now is not None and first.changes(now):
        if CHANGED not in flags:
            warnings.append(change_message(first, now, "since the sweep's first level"))
        flags.append(SWEEP_CHANGED)
    return replace(summary, warnings=tuple(warnings), flags=tuple(flags))


def switch_counts(log: Path | None) -> dict[str, object] | None:
    """The speculation switch's cumulative batch counts in the server's log now (None: no log, or no such line)."""
    if log is None:
        return None
    try:
        data, truncated = bounded.read_tail(log, 4 << 20)
    except bounded.Unreadable:
        return None
    lines = data.decode("utf-8", "replace").splitlines()
    return plain_decode.counts(lines[1:] if truncated else lines)


def switch_meta(before: dict[str, object] | None, after: dict[str, object] | None) -> dict[str, object]:
    """The level's plain and speculative decode batches per batch size, from the counts around it ({} without)."""
    if after is None:
        return {}
    out: dict[str, object] = {}
    for kind in ("plain", "speculative"):
        now, then = after.get(kind), (before or {}).get(kind) or {}
        if not isinstance(now, dict) or not isinstance(then, dict):
            return {}
        grew = {b: int(n) - int(then.get(b, 0)) for b, n in sorted(now.items())}
        out[kind] = {str(b): n for b, n in grew.items() if n > 0}
    skipped, then_skipped = after.get("draft_prefills_skipped"), (before or {}).get("draft_prefills_skipped", 0)
    if isinstance(skipped, int) and isinstance(then_skipped, int):  # an earlier switch's log has no such count
        out["draft_prefills_skipped"] = skipped - then_skipped
    return {"plain_decode_batches": out}


def default_out(now: datetime.datetime | None = None) -> Path:
    """Where the records go without --out: bench-<UTC time>.jsonl in the current directory."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return Path(f"bench-{now:%Y%m%dT%H%M%S}.jsonl")


def eta_text(seconds: float) -> str:
    """A remaining time as a person reads it: 'about 40 s', 'about 3 min', 'about 1 h 20 min'."""
    if seconds < 60:
        return f"about {max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    return f"about {minutes} min" if minutes < 60 else f"about {minutes // 60} h {minutes % 60} min"


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


@dataclass(frozen=True)
class _Server:
    """What the sweep learned from the server before its first level."""

    endpoint: Endpoint
    api: Api
    headers: dict[str, str]
    info_timeout: float
    engine: str


@dataclass(frozen=True)
class _Level:
    """One level of the sweep, either loop mode."""

    number: int
    step: float  # the concurrency (closed loop) or the offered rate (open loop)
    name: str  # "C=8", "rate 2/s"
    prompt_key: int  # a closed level's concurrency; an open level's index (for its unique prompts)


@dataclass(frozen=True)
class _Start:
    """The server as a level starts: its identity, the switch's counts in its log, its /metrics."""

    identity: ServerIdentity | None
    switch: dict[str, object] | None
    scrape: Scrape | None
    at: datetime.datetime


@dataclass(frozen=True)
class _Measured:
    """A level as its loop mode measured it."""

    records: list[RequestRecord]
    t0: float | None
    t1: float | None
    ended: datetime.datetime
    summary: LevelSummary
    meta: dict[str, Any]  # the loop mode's own record fields
    stalled: HttpError | None  # the server stalled or went away as the level ended


Announce = Callable[[str], None]
StartLevel = Callable[[], Awaitable[_Start]]
MakeSpec = Callable[[int], RequestSpec]


@dataclass(frozen=True)
class _ClosedLoop:
    """Fixed concurrency: C workers, each sending its next request when the last one finishes."""

    config: SweepConfig

    def levels(self) -> list[_Level]:
        return [_Level(n, float(c), f"C={c}", c) for n, c in enumerate(self.config.levels)]

    def weight(self, level: _Level) -> float:
        """What a level costs, for the ETA (a guess: its measured requests; its seconds with --duration)."""
        config = self.config
        return (
            1.0
            if config.duration is not None
            else float(config.requests_per_level or default_requests(level.prompt_key))
        )

    def plan(self, level: _Level) -> LevelPlan:
        config, c = self.config, level.prompt_key
        if config.duration is not None:
            plan = LevelPlan(c, duration=config.duration, warmup=config.warmup, min_lifetimes=config.min_lifetimes)
        else:
            plan = LevelPlan(c, requests=config.requests_per_level or default_requests(c), warmup=config.warmup)
        return replace(
            plan,
            request_timeout=config.request_timeout,
            level_timeout=config.level_timeout,
            fresh_connections=config.fresh_connections,
        )

    async def measure(
        self, level: _Level, of: str, server: _Server, make_spec: MakeSpec, say: Announce, start: StartLevel
    ) -> tuple[_Start, _Measured]:
        plan = self.plan(level)
        amount = plan.requests or f"{plan.duration:g} s of"
        say(f"{of}{level.name}: {amount} measured requests after {self.config.warmup} warm-up each")
        begun = await start()
        counter = GENERATION_COUNTERS.get(server.engine)
        sampler = CounterSampler(server.endpoint, server.headers, counter, server.info_timeout) if counter else None
        run = run_level(server.endpoint, server.api, plan, make_spec, server.headers, say)
        if sampler is not None:
            async with sampler:
                records, t0, t1, timed_out = await run
        else:
            records, t0, t1, timed_out = await run
        ended = datetime.datetime.now(datetime.timezone.utc)
        summary = _lifetimes_warning(summarize(plan.concurrency, records, t0, t1, timed_out), plan)
        meta: dict[str, Any] = {}
        if sampler is not None:
            window = judge_window(sampler.trace, t0, t1, summary.throughput_tok_s, summary.window_lifetimes)
            meta.update(window.to_meta())
            if window.warning:
                summary = replace(summary, warnings=(*summary.warnings, window.warning))
        stalled = sampler.failure if sampler is not None else None
        return begun, _Measured(records, t0, t1, ended, summary, meta, stalled)


def _lifetimes_warning(summary: LevelSummary, plan: LevelPlan) -> LevelSummary:
    """A --min-lifetimes window the level timeout cut short says so."""
    spanned = summary.window_lifetimes
    if plan.min_lifetimes is None or spanned is None or spanned >= plan.min_lifetimes:
        return summary
    short = (
        f"the steady window at C={plan.concurrency} spans {spanned:.1f} request lifetimes, short of --min-lifetimes "
        f"{plan.min_lifetimes:g}: --level-timeout {plan.level_timeout:g} s capped it; raise --level-timeout"
    )
    return replace(summary, warnings=(*summary.warnings, short))


@dataclass(frozen=True)
class _OpenLoop:
    """Offered request rates: arrivals on a schedule, whatever the server's pace."""

    config: SweepConfig
    rates: tuple[float, ...]

    def levels(self) -> list[_Level]:
        return [_Level(n, rate, f"rate {rate:g}/s", n) for n, rate in enumerate(self.rates)]

    def weight(self, level: _Level) -> float:
        config = self.config
        return (
            1.0
            if config.duration is not None
            else float(config.requests_per_level or default_rate_requests(level.step))
        )

    def plan(self, level: _Level) -> RatePlan:
        config = self.config
        return RatePlan(
            Arrivals(level.step, config.burstiness, seed=config.seed + level.number),
            requests=None
            if config.duration is not None
            else config.requests_per_level or default_rate_requests(level.step),
            duration=config.duration,
            warmup=config.warmup,
            max_in_flight=config.max_in_flight,
            request_timeout=config.request_timeout,
            level_timeout=config.level_timeout,
            fresh_connections=config.fresh_connections,
        )

    async def measure(
        self, level: _Level, of: str, server: _Server, make_spec: MakeSpec, say: Announce, start: StartLevel
    ) -> tuple[_Start, _Measured]:
        plan = self.plan(level)
        amount = plan.requests or f"{plan.duration:g} s of"
        arrivals, warmup = plan.arrivals.describe, self.config.warmup
        say(f"{of}{level.name}: {amount} measured arrivals ({arrivals}) after {warmup} warm-up")
        begun = await start()
        stats = OpenLoopStats()
        records, t0, t1, timed_out = await run_rate_level(
            server.endpoint, server.api, plan, make_spec, server.headers, say, stats=stats
        )
        ended = datetime.datetime.now(datetime.timezone.utc)
        in_flight = plan.max_in_flight or max(peak_in_flight(records), 1)
        summary = summarize(in_flight, records, t0, t1, timed_out)
        summary = replace(
            summary,
            mode="open",
            request_rate=level.step,
            burstiness=self.config.burstiness,
            warnings=(*summary.warnings, *stats.warnings(plan)),
        )
        return begun, _Measured(records, t0, t1, ended, summary, _open_meta(stats, plan), None)


def _open_meta(stats: OpenLoopStats, plan: RatePlan) -> dict[str, Any]:
    return {
        "offered_rate": stats.offered_rate,
        "max_in_flight": plan.max_in_flight,
        "arrivals": {
            "total": stats.arrivals,
            "measured": stats.measured,
            "tail": stats.tail,
            "waited_for_slot": stats.waited_for_slot,
            "peak_in_flight": stats.peak_in_flight,
        },
    }


@dataclass(frozen=True)
class _Discovered:
    """The server as the sweep found it before any load, and what every level shares."""

    server: _Server
    facts: ServerFacts
    first_info: dict[str, object]  # its SGLang server info at discovery
    model: str  # the model name requests carry ("" for SGLang's /generate without --model)
    cache_prompt: bool | None  # llama.cpp's cache_prompt (False: off); None: not sent
    family: SpecFamily | None  # the engine's /metrics names, when it has /metrics
    meta: dict[str, Any]  # what every record's meta starts with


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def local_gpus(endpoint: Endpoint) -> dict[str, list[str]]:
    """{"gpus": names} of this host's GPUs when the server is on this host (a loopback URL), from nvidia-smi within
    a few seconds (what crossover's plot title names); {} for a remote server, no nvidia-smi or no answer."""
    smi = shutil.which("nvidia-smi")
    if endpoint.host not in LOOPBACK or smi is None:
        return {}
    try:
        done = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    names = [line.strip()[:80] for line in done.stdout.splitlines() if line.strip()][:64]
    return {"gpus": names} if done.returncode == 0 and names else {}


async def _discover(config: SweepConfig) -> _Discovered:
    """Ask the server what it is (ApiMismatch when it does not speak --api) and settle the model and prompt options."""
    api, endpoint, info_timeout = config.api, config.endpoint, config.info_timeout
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    first_info = await fetch_server_info(endpoint, headers, info_timeout)
    facts = await discover(endpoint, headers, info_timeout, first_info)
    if config.log_backend is not None:
        facts = facts.with_log(config.log_backend)
    _check_api(api, facts, endpoint, bool(config.model))
    model = config.model
    if api is not Api.SGLANG and not model:
        model = facts.first_model_id or await fetch_model_name(endpoint, headers, info_timeout)
    reuse = config.reuse_prompts
    # llama.cpp's cache_prompt; SGLang's /generate and vLLM reject keys they do not know
    cache_prompt = False if facts.engine == "llama.cpp" and api is not Api.SGLANG and not reuse else None
    meta: dict[str, Any] = {
        "api": api.value,
        "url": str(endpoint),
        "model": model or facts.model,
        "args": {k: (str(v) if isinstance(v, (Path, Slo)) else v) for k, v in config.recorded_args.items()},
        "client": {"host": socket.gethostname(), "sm120check": __version__, **local_gpus(endpoint)},
        "prompts": {"unique": not reuse, "cache_prompt": cache_prompt, "source": config.prompt_source},
        "pause_s": config.pause,
    }
    family = family_for(facts.engine) if facts.has_metrics else None
    server = _Server(endpoint, api, headers, info_timeout, facts.engine)
    return _Discovered(server, facts, first_info, model, cache_prompt, family, meta)


@dataclass(frozen=True)
class _After:
    """What the server said once a level ended."""

    summary: LevelSummary
    facts: ServerFacts
    info: dict[str, object]  # its SGLang server info ({} without)
    identity: ServerIdentity | None
    meta: dict[str, Any]  # the /metrics counters' accept length, when they gave it
    stalled: HttpError | None  # it stalled or went away: the sweep stops after this level


async def _after_level(
    server: _Server, facts: ServerFacts, family: SpecFamily | None, begun: _Start, measured: _Measured, slo: Slo | None
) -> _After:
    """Goodput, then the server's counters, info and identity after the level (nothing asked of a stalled server)."""
    summary, stalled = measured.summary, measured.stalled
    if slo is not None:
        summary = replace(summary, goodput=compute_goodput(slo, measured.records, measured.t0, measured.t1))
    meta: dict[str, Any] = {}
    info: dict[str, object] = {}
    identity: ServerIdentity | None = None
    if stalled is not None:  # the server stalled or went away as the level ended: ask it nothing more
        summary = replace(summary, warnings=(*summary.warnings, f"/metrics after the level: {stalled}"))
    else:
        endpoint, headers, timeout = server.endpoint, server.headers, server.info_timeout
        try:
            if family is not None and begun.scrape is not None:
                after = await _settled_scrape(endpoint, headers, timeout, family)
                if after is not None:
                    facts = facts.with_scrape(after)
                    summary, meta = _metrics_accept(summary, family, begun.scrape, after)
                    busy, problem = forward_seconds(begun.scrape, after)
                    if busy is not None:
                        meta["server_forward_seconds"] = {k: round(v, 6) for k, v in busy.items()}
                    if problem:
                        summary = replace(summary, warnings=(*summary.warnings, problem))
            info = await fetch_server_info(endpoint, headers, timeout) if facts.sglang_info else {}
            identity = await _identity(endpoint, headers, facts, timeout, info if facts.sglang_info else None)
        except HttpError as exc:  # the level is measured: keep it, then stop
            stalled = exc
            summary = replace(summary, warnings=(*summary.warnings, f"server info after the level: {exc}"))
    if stalled is not None:
        summary = replace(summary, flags=(*summary.flags, SERVER_LOST_FLAG))
    return _After(summary, facts, info, identity, meta, stalled)


def _level_meta(
    shared: dict[str, Any],
    facts: ServerFacts,
    begun: _Start,
    measured: _Measured,
    after: _After,
    identity: LevelIdentity,
    server_accept: float | None,
    switch_after: dict[str, object] | None,
) -> dict[str, Any]:
    """A level record's meta: the sweep's, the server's, the level's times, then each source's own fields."""
    started, ended = begun.at, measured.ended
    return dict(
        shared,
        server=facts.to_record(),
        started_at=started.isoformat(timespec="seconds"),
        level_started_at=started.isoformat(timespec="milliseconds"),
        level_ended_at=ended.isoformat(timespec="milliseconds"),
        level_started_epoch=round(started.timestamp(), 3),
        level_ended_epoch=round(ended.timestamp(), 3),
        server_accept_length_cumulative=server_accept,
        **switch_meta(begun.switch, switch_after),
        **{META: identity.to_json()},
        **measured.meta,
        **after.meta,
    )


async def _sweep(config: SweepConfig, summaries: list[LevelSummary]) -> None:
    """Run every level, appending each finished level to `summaries` (and to --out) as soon as it is measured."""

    def say(line: str) -> None:  # warnings carry the server's text: made inert for the terminal
        if not config.quiet:
            print(terminal_text(line, one_line=True), file=sys.stderr, flush=True)

    found = await _discover(config)
    server, facts, family = found.server, found.facts, found.family
    run_id = uuid.uuid4().hex[:12]
    pool = config.prompts or synthetic_prompts(max(4 * max(config.levels), 64), config.input_len, config.seed)
    mode: _ClosedLoop | _OpenLoop = _OpenLoop(config, config.rates) if config.rates else _ClosedLoop(config)
    levels = mode.levels()
    weights = [mode.weight(level) for level in levels]
    loop = asyncio.get_running_loop()
    sweep_start, weights_done = loop.time(), 0.0
    first_identity: ServerIdentity | None = None
    last_identity: ServerIdentity | None = None
    for level in levels:
        number, name = level.number, level.name

        def make_spec(i: int, c: int = level.prompt_key) -> RequestSpec:
            body = pool[i % len(pool)]
            prompt = body if config.reuse_prompts else unique_prompt(body, run_id, c, i)
            tokens = output_len(config.output_len, config.output_len_spread, config.seed, c, i)
            return RequestSpec(prompt, tokens, config.temperature, config.ignore_eos, found.model, found.cache_prompt)

        async def start(number: int = number, facts: ServerFacts = facts) -> _Start:
            # the first level's start is what the server said just before it (discovery); later ones are read again
            info = None if number else found.first_info
            identity = await _identity(server.endpoint, server.headers, facts, server.info_timeout, info)
            switch = switch_counts(config.server_log)
            scrape = await scrape_metrics(server.endpoint, server.headers, server.info_timeout) if family else None
            return _Start(identity, switch, scrape, datetime.datetime.now(datetime.timezone.utc))

        of = f"level {number + 1} of {len(levels)}, "
        begun, measured = await mode.measure(level, of, server, make_spec, say, start)
        after = await _after_level(server, facts, family, begun, measured, config.slo)
        facts = after.facts
        identity = LevelIdentity(begun.identity, after.identity)
        summary = _identity_flags(after.summary, identity, last_identity, first_identity)
        first_identity = first_identity or begun.identity or after.identity
        last_identity = after.identity or begun.identity
        server_accept, accept_problem = cumulative_accept(after.info)
        if accept_problem:
            summary = replace(
                summary,
                warnings=(*summary.warnings, f"{accept_problem}; not used"),
                flags=(*summary.flags, "untrusted_server_accept_length"),
            )
        switch_after = switch_counts(config.server_log)
        meta = _level_meta(found.meta, facts, begun, measured, after, identity, server_accept, switch_after)
        if problem := draft_problem(summary.concurrency, facts.speculative, summary.accept_length):
            summary = replace(summary, warnings=(*summary.warnings, problem), flags=(*summary.flags, DRAFT_FLAG))
        summary = replace(summary, label=config.label, run_id=run_id, meta=meta)
        summaries.append(summary)
        try:
            append_jsonl(config.out, [summary])
        except OSError as exc:  # checked up front; this is a disk that filled or went away during the sweep
            message = f"cannot append the {name} record to {config.out}: {exc.strerror or exc}"
            raise SweepError(message, records_kept=False) from None
        say(_level_line(name, summary))
        for warning in summary.warnings:
            say(f"  warning: {warning}")
        weights_done += weights[number]
        if number < len(levels) - 1 and weights_done > 0:
            left = (loop.time() - sweep_start) / weights_done * sum(weights[number + 1 :])
            say(f"  {len(levels) - number - 1} level(s) left, {eta_text(left)} (a guess from the levels so far)")
        if after.stalled is not None:
            raise SweepError(f"stopped after {name}: {after.stalled}")
        if config.pause > 0 and number < len(levels) - 1:
            await asyncio.sleep(config.pause)


def _level_line(name: str, summary: LevelSummary) -> str:
    """The progress line a finished level prints."""
    accept = f", accept length {summary.accept_length:.2f}" if summary.accept_length else ""
    good = ""
    if summary.goodput is not None:
        g = summary.goodput
        good = f", goodput {g.request_goodput:.2f} req/s ({g.good}/{g.finished} met --slo)"
    return (
        f"{name}: {summary.throughput_tok_s:.1f} tok/s, {summary.per_request_mean:.1f} tok/s per request, "
        f"{summary.errors}/{summary.requests} errors{accept}{good}"
    )


def _check_api(api: Api, facts: ServerFacts, endpoint: Endpoint, model_given: bool) -> None:
    """--api against a server that does not speak it is a usage error, named before any load is sent."""
    other = "--api openai-chat or --api openai-completions"
    if api is Api.SGLANG and not facts.sglang_info and facts.openai_models:
        what = "llama.cpp" if facts.engine == "llama.cpp" else facts.engine if facts.engine != "unknown" else "it"
        raise ApiMismatch(
            f"the server at {endpoint} is not SGLang ({what} answers /v1/models, but /get_server_info and "
            f"/server_info are 404); use {other}"
        )
    if api is not Api.SGLANG and facts.openai_models is False and not model_given:
        hint = "use --api sglang" if facts.sglang_info else "is --url the server's base URL?"
        raise ApiMismatch(
            f"the server at {endpoint} has no OpenAI routes (GET /v1/models is 404) for --api {api.value}; {hint}"
        )


async def _settled_scrape(
    endpoint: Endpoint, headers: dict[str, str], timeout: float, family: SpecFamily
) -> Scrape | None:
    """/metrics once the in-flight gauge reads 0 (bounded): counters move when a request is released, so the
    level's last releases are in it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + IN_FLIGHT_WAIT_S
    while True:
        scrape = await scrape_metrics(endpoint, headers, timeout)
        busy = scrape.value(family.in_flight) if scrape is not None else None
        if busy is None or busy <= 0 or loop.time() >= deadline:
            return scrape
        await asyncio.sleep(0.1)


def _metrics_accept(
    summary: LevelSummary, family: SpecFamily, before: Scrape, after: Scrape
) -> tuple[LevelSummary, dict[str, Any]]:
    """The level's accept length from the /metrics counters' growth, used when no response carried one."""
    delta = spec_delta(family, before, after)
    extra: dict[str, Any] = {}
    problems = list(delta.problems)
    if after.skipped:
        problems.append(f"/metrics: {after.skipped} line(s) that are not samples were skipped ({after.problems[0]})")
    if problems:
        summary = replace(summary, warnings=(*summary.warnings, *problems))
    if delta.spec is None:
        return summary, extra
    value = delta.spec.accept_length
    extra["metrics_delta"] = delta.spec.to_meta()
    # llama.cpp's timings have no count of verify steps, so the per-request value is tokens per target step (steps
    # without a draft count as 1); the counters give the engine's own tokens per verify step: prefer them. SGLang's
    # meta_info.spec_verify_ct (--api sglang) is the engine's own per request: it stays
    if value is not None and (summary.accept_length is None or summary.accept_source == "timings.draft_n_accepted"):
        extra["accept_length_timings"] = summary.accept_length
        summary = replace(summary, accept_length=value, accept_source=family.accept_source)
    return summary, extra


async def fetch_model_name(endpoint: Endpoint, headers: dict[str, str], timeout: float = 30.0) -> str:
    conn = Connection(endpoint, headers, connect_timeout=min(timeout, 10.0))
    try:
        data = await bounded_get_json(conn, "/v1/models", timeout)
    except HttpError as exc:
        raise HttpError(f"{exc}; pass --model NAME") from None
    finally:
        await conn.close()
    models = data.get("data") if isinstance(data, dict) else None
    if isinstance(models, list) and models and isinstance(models[0], dict) and "id" in models[0]:
        return str(models[0]["id"])
    raise HttpError("GET /v1/models listed no model; pass --model NAME")
