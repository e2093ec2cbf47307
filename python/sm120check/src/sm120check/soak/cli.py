"""`sm120check soak`: hold a node under the load it will serve and watch every GPU once a second.

With --url, C closed-loop workers (the bench's) keep a live server busy for --duration seconds while a sampler child
reads every GPU through NVML (clocks and every clock-event reason, power and its limit, GPU and memory temperature,
the slowdown threshold, fan, ECC and remapped rows, the PCIe link and its replays) and waits for Xid events. Without
--url it samples only (run your own load). The soak starts and stops no server, and changes no clock, power or fan
setting. Ctrl-C, SIGTERM or the duration end it cleanly: the records written so far are kept and judged.

The record, in --out: soak.jsonl (the time series), soak.json / soak.junit.xml / soak.prom (the doctor's report
formats over the verdicts), soak.png (tokens/s, SM clock, power, temperatures and fan, Xids and throttling marked).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from sm120check import __version__
from sm120check.bench.apis import Api, RequestSpec
from sm120check.bench.cli import API_KEY_ENV
from sm120check.bench.http import Endpoint
from sm120check.bench.prompts import synthetic_prompts, unique_prompt
from sm120check.doctor import child, report
from sm120check.doctor.gpu import kernel_log
from sm120check.doctor.model import Status
from sm120check.exitcodes import Exit
from sm120check.soak import record, verdicts
from sm120check.soak.drive import Traffic, drive, intervals
from sm120check.soak.samples import Sample, SamplerNote, parse_lines

LOAD = "sm120check.soak.load"  # the doctor's FMA kernel, again and again (--sm-load)
SAMPLER = "sm120check.soak.sampler"  # the child module; tests name a stand-in where no GPU exists
HANG_S = 20.0  # the sampler said nothing for this long: an NVML call hangs, it is killed
GRACE_S = 30.0  # past the duration, the sampler's hard bound


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "soak",
        help="hold the node under serving load and watch every GPU once a second (NVML, Xid events)",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--url", help="a live server to drive (base URL); without it the soak samples only")
    p.add_argument("--api", choices=("sglang", "openai-completions", "openai-chat"), default="sglang")
    p.add_argument(
        "--concurrency", type=_positive, help="closed-loop workers (with --url: this, or the level --from-sweep gives)"
    )
    p.add_argument(
        "--from-sweep",
        type=Path,
        metavar="BENCH_JSONL",
        help="with --url and no --concurrency: soak at the highest closed-loop level of this `sm120check bench` file",
    )
    p.add_argument("--duration", type=_seconds, default=300.0, help="seconds of soak")
    p.add_argument("--interval", type=_seconds, default=1.0, help="seconds between GPU samples")
    p.add_argument("--stall", type=_seconds, default=30.0, help="no token this long with requests in flight: stall")
    p.add_argument("--sustain", type=_seconds, default=30.0, help="throttling or a collapse this long: sustained")
    p.add_argument("--input-len", type=_positive, default=256, help="synthetic prompt length in words")
    p.add_argument("--output-len", type=_positive, default=256, help="output tokens per request")
    p.add_argument("--model", default="", help="model name for the OpenAI APIs")
    p.add_argument("--request-timeout", type=_seconds, default=600.0, help="seconds per request")
    p.add_argument("--gpus", default="", help="NVML indices to sample, comma-separated (default: all)")
    p.add_argument("--out", type=Path, help="record folder (default: a new soak-YYYYmmddTHHMMSS here)")
    p.add_argument("--no-png", action="store_true", help="skip the PNG (no matplotlib needed)")
    p.add_argument(
        "--sm-load",
        action="store_true",
        help="without --url: keep every GPU's SMs busy with the doctor's FMA kernel while sampling",
    )
    p.add_argument(
        "--fleet",
        type=Path,
        nargs="+",
        metavar="PATH",
        help="soak nothing: show each node's soak verdict and its outliers from soak.json files (or folders of them)",
    )
    p.set_defaults(handler=handle)


def _positive(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 100_000:
        raise argparse.ArgumentTypeError(f"{text}: expected a whole number from 1 to 100000")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: expected seconds") from None
    if not 0 < value <= 7 * 86400:
        raise argparse.ArgumentTypeError(f"{text}: expected seconds above 0, at most a week")
    return value


class _Stop:
    """Ctrl-C / SIGTERM: end the soak cleanly (records kept); the signal is remembered for the exit status."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.async_event: asyncio.Event | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.signum = self.signum or signum
        self.event.set()
        if self.loop is not None and self.async_event is not None:
            self.loop.call_soon_threadsafe(self.async_event.set)


def handle(args: argparse.Namespace) -> int:
    if args.fleet:
        from sm120check.soak import fleet

        view = fleet.load(args.fleet)
        if not view.nodes:
            print(f"sm120check soak: no soak.json under {', '.join(map(str, args.fleet))}", file=sys.stderr)
            return Exit.USAGE
        print(fleet.render(view))
        return Exit.FOUND if view.failed or view.review.outliers else Exit.OK
    if args.url and args.sm_load:
        print(
            "sm120check soak: --sm-load is the load when no server is driven: give --url or --sm-load", file=sys.stderr
        )
        return Exit.USAGE
    if args.url and not args.concurrency and args.from_sweep is not None:
        from sm120check.bench.records import RecordError, read_jsonl

        try:
            levels = [s.concurrency for s in read_jsonl(args.from_sweep) if s.mode == "closed"]
        except RecordError as exc:
            print(f"sm120check soak: --from-sweep: {exc}", file=sys.stderr)
            return Exit.USAGE
        if not levels:
            print(f"sm120check soak: --from-sweep {args.from_sweep} has no closed-loop level", file=sys.stderr)
            return Exit.USAGE
        args.concurrency = max(levels)
        print(
            f"sm120check soak: concurrency {args.concurrency}, the highest level of {args.from_sweep}", file=sys.stderr
        )
    if args.url and not args.concurrency:
        print("sm120check soak: --url needs --concurrency N or --from-sweep BENCH_JSONL", file=sys.stderr)
        return Exit.USAGE
    endpoint = None
    if args.url:
        try:
            endpoint = Endpoint.parse(args.url)
        except ValueError as exc:
            print(f"sm120check soak: {exc}", file=sys.stderr)
            return Exit.USAGE
    folder: Path = args.out or Path(f"soak-{datetime.datetime.now().strftime('%Y%m%dT%H%M%S')}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"sm120check soak: --out {folder}: {exc.strerror or exc}", file=sys.stderr)
        return Exit.USAGE
    jsonl, stop_file = folder / record.JSONL, folder / ".stop"
    stop_file.unlink(missing_ok=True)
    start = time.time()
    boot_epoch = start - time.monotonic()  # printk's clock counts from boot, as CLOCK_MONOTONIC does
    record.write_meta(
        jsonl,
        {
            "host": socket.gethostname(),
            "start": start,
            "sm120check": __version__,
            "url": str(endpoint) if endpoint else "",
            "concurrency": args.concurrency,
            "duration": args.duration,
        },
    )
    stop = _Stop()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    outcome: list[child.ChildOutcome] = []
    sampler_args = ["--out", str(jsonl), "--duration", str(args.duration), "--interval", str(args.interval)]
    sampler_args += ["--stop", str(stop_file)] + (["--gpus", args.gpus] if args.gpus else [])
    thread = threading.Thread(
        target=lambda: outcome.append(
            child.run_probe(
                SAMPLER,
                sampler_args,
                timeout=args.duration + GRACE_S,
                env=child.probe_env(),
                idle=max(HANG_S, 3 * args.interval),  # it speaks once an interval
            )
        ),
        daemon=True,
    )
    loaded: list[child.ChildOutcome] = []
    load_args = ["--duration", str(args.duration), "--stop", str(stop_file)] + (
        ["--gpus", args.gpus] if args.gpus else []
    )
    loader = threading.Thread(
        target=lambda: loaded.append(
            child.run_probe(LOAD, load_args, timeout=args.duration + GRACE_S, env=child.probe_env(), idle=HANG_S * 3)
        ),
        daemon=True,
    )
    traffic = Traffic()
    try:
        thread.start()
        if args.sm_load:
            loader.start()
        if endpoint is not None:
            asyncio.run(_drive(args, endpoint, traffic, stop))
        else:  # sample only: until the duration, a signal, or the sampler's end (no NVML here)
            deadline = time.monotonic() + args.duration
            while thread.is_alive() and not stop.event.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    break
    finally:
        stop_file.touch()
        thread.join(args.duration + GRACE_S + 10)
        if args.sm_load:
            loader.join(args.duration + GRACE_S + 10)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    end = time.time()
    stop_file.unlink(missing_ok=True)
    late: list[Sample] = [*_sampler_fate(outcome[0] if outcome else None)]
    if args.sm_load:
        late.append(_load_note(loaded[0] if loaded else None))
    log = kernel_log.read()
    late += verdicts.from_kernel_log(log.events, boot_epoch, start)
    if endpoint is not None:
        late += intervals(traffic.records, traffic.epoch, start, end)
    record.append(jsonl, late)
    samples, skipped = parse_lines(jsonl.read_text(encoding="utf-8"))
    soak = verdicts.Soak(tuple(samples), start, endpoint is not None, verdicts.Bounds(args.sustain, args.stall))
    results = verdicts.judge(soak)
    info = report.RunInfo(
        socket.gethostname(),
        __version__,
        datetime.datetime.fromtimestamp(start, datetime.timezone.utc).isoformat(),
        end - start,
        verdicts.LEVEL,
        "",
        start,
        signal.Signals(stop.signum).name if stop.signum else "",
    )
    written = record.write_reports(folder, results, info)
    if not args.no_png:
        try:
            record.plot(folder / record.PNG, samples, start)
            written.append(folder / record.PNG)
        except Exception as exc:  # matplotlib missing or failing: the record stands without its picture
            print(f"sm120check soak: no PNG: {exc}", file=sys.stderr)
    print(report.table(results, info))
    for note in skipped[:5]:
        print(f"sm120check soak: {jsonl}: {note}", file=sys.stderr)
    names = ", ".join(str(p) for p in [jsonl, *written])
    print(f"sm120check soak: {end - start:.0f} s recorded in {names}", file=sys.stderr)
    if stop.signum:
        return Exit.signalled(stop.signum)
    return Exit.FOUND if any(r.status is Status.FAIL for r in results) else Exit.OK


def _sampler_fate(outcome: child.ChildOutcome | None) -> list[SamplerNote]:
    now = time.time()
    if outcome is None:
        return [SamplerNote(now, "hung", "the sampler did not end within its bound")]
    if outcome.ok or outcome.data.get("error"):  # done, or it wrote why it could not start
        return []
    where = f" at: {outcome.step}" if outcome.step else ""
    event = "hung" if outcome.silent is not None or outcome.timed_out else "failed"
    return [SamplerNote(now, event, f"the sampler {outcome.problem}{where}")]


def _load_note(outcome: child.ChildOutcome | None) -> SamplerNote:
    """What became of --sm-load, for the record (the samples show its effect)."""
    if outcome is None:
        return SamplerNote(time.time(), "load", "the SM load did not end within its bound")
    if outcome.ok:
        return SamplerNote(time.time(), "load", f"the SM load ran {outcome.data.get('rounds')} rounds")
    said = outcome.data.get("error") or outcome.problem
    return SamplerNote(time.time(), "load", f"the SM load did not run to the end: {said}")


async def _drive(args: argparse.Namespace, endpoint: Endpoint, traffic: Traffic, stop: _Stop) -> None:
    stop.loop = asyncio.get_running_loop()
    stop.async_event = asyncio.Event()
    if stop.event.is_set():
        stop.async_event.set()
    pool = synthetic_prompts(max(64, 4 * args.concurrency), args.input_len, 0)
    run = os.urandom(6).hex()
    key = os.environ.get(API_KEY_ENV)
    headers = {"Authorization": f"Bearer {key}"} if key else None

    def make_spec(i: int) -> RequestSpec:
        return RequestSpec(
            unique_prompt(pool[i % len(pool)], run, args.concurrency, i), args.output_len, model=args.model
        )

    await drive(
        endpoint, Api(args.api), args.concurrency, args.duration, make_spec, traffic, stop.async_event,
        headers=headers, request_timeout=args.request_timeout,
    )  # fmt: skip
