"""What the SGLang server tests on the GPU machine share (tests/gpu/test_sglang_server.py, test_sglang_policy.py):
the patch and its digest, the models written there, a server started from a launch file the sglang_server role
rendered (tests/gpu/launch) under the role's bounded wait, verify-launch, and one bench level held against the
server's own counters. Artifacts go to $SM120KIT_GPU_OUT."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab import decode_log, server_pids
from sm120check.bench import metrics
from sm120check.bench.server_rate import MIN_LIFETIMES, outside
from sm120check.sglang import http_workers, port_owner, startup_log

# The marks of every SGLang server test module in tests/gpu: a GPU and a carried SGLang, or a skip saying which
MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(not Path("/proc/driver/nvidia/version").exists(), reason="no NVIDIA driver on this machine"),
    pytest.mark.skipif(
        importlib.util.find_spec("sglang") is None,
        reason="SGLang is not installed: carry it (scripts/device/sglang_stack.py build here, then "
        "scripts/device/sglang-server.sh venv on the GPU machine)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "tests" / "gpu" / "launch"
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
OUT = Path(os.environ.get("SM120KIT_GPU_OUT") or tempfile.mkdtemp(prefix="sglang-gpu-"))
# The served pair (tests/lab/sglang_models.py): a Llama target of 16 layers at the 7B width and its EAGLE-3 draft,
# 10 % of the draft's head rows wrong (expected accept length 3.44 at 3 steps).
MODEL_ARGS = ["--layers", "16", "--hidden", "4096", "--intermediate", "11008", "--vocab", "32000"]
MODEL_ARGS += ["--heads", "32", "--kv-heads", "8", "--draft-error", "0.1", "--seed", "7"]
BASE_LEVELS = (1, 8, 64, 256)
SPEC_LEVELS = (1, 8, 64)
TOLERANCE = 0.05  # the issue's: throughput and accept length within 5 % of the server's own figures
# Seconds of steady window per level: the first GPU run's default of 4 x C requests gave 3-4 request lifetimes at
# high concurrency, too short for a completion counter to agree with a streaming rate (bench/server_rate.py).
LEVEL_S = 10


def child_env() -> dict[str, str]:
    src = str(ROOT / "python" / "sm120check" / "src")
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, **SAFE_ENV, "PYTHONPATH": f"{src}:{path}" if path else src, "PYTHONUNBUFFERED": "1"}


def sm120check(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "sm120check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=timeout, check=False)


def tree_digest(tree: Path) -> str:
    """sha256 over every file's path and bytes (the patcher's ledger and backups live outside the tree)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in tree.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(tree)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def save(name: str, data: object) -> None:
    (OUT / name).write_text(data if isinstance(data, str) else json.dumps(data, indent=1), encoding="utf-8")


@dataclass(frozen=True)
class Patched:
    tree: Path
    before: str  # digest of the tree as installed
    report: dict[str, Any]


def patch_tree() -> Patched:
    """Patch the installed SGLang for 9.0 with sm120check, after taking the tree's digest."""
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations
    tree = Path(next(iter(spec.submodule_search_locations)))
    before = tree_digest(tree)
    run = sm120check("sglang", "patch", "--cc", "9.0", "--json")
    save("patch.json", run.stdout or run.stderr)
    assert run.returncode == 0, run.stderr[-2000:]
    return Patched(tree, before, json.loads(run.stdout))


def write_models(launch: str = "spec.txt", draft_error: float = 0.1) -> Path:
    """The served pair of a launch file, written on this GPU from a seed (never carried): `draft_error` 0.1 for the
    pair every server but one runs (the envelope phases take another, SM120KIT_ENVELOPE_DRAFT_ERROR), 1.0 for
    bad-draft.txt's draft that is never accepted (same seed, same target)."""
    where = Path(shlex.split((LAUNCH / launch).read_text())[4]).parent  # --model-path DIR/target
    stamp = where / "draft-error.txt"  # the pair on disk is rewritten when a call asks for another draft error
    written = stamp.read_text(encoding="utf-8").strip() if stamp.is_file() else None
    pair = (where / "target" / "config.json").is_file() and (where / "draft" / "config.json").is_file()
    if not pair or written != str(draft_error):
        cmd = [sys.executable, str(ROOT / "tests" / "lab" / "sglang_models.py"), "write", "--out", str(where)]
        args = [*MODEL_ARGS[: MODEL_ARGS.index("--draft-error")], "--draft-error", str(draft_error), "--seed", "7"]
        run = subprocess.run([*cmd, "--device", "cuda", "--force", *args], capture_output=True, text=True, timeout=600)
        save(f"models-{where.name}.txt", run.stdout + run.stderr)
        assert run.returncode == 0, run.stderr[-2000:]
        stamp.write_text(str(draft_error), encoding="utf-8")
    return where


@dataclass(frozen=True)
class GaugeSample:
    """One read of the server's scheduler gauges (sglang:* in /metrics, set at each decode log line)."""

    at: float  # monotonic seconds
    running: float  # num_running_reqs
    num_steps: float  # spec_num_steps: the draft steps the adaptive slot chose (0: speculation off)
    draft_tokens: float  # spec_num_draft_tokens
    accept_length: float  # spec_accept_length over the last log interval


class GaugeSampler:
    """Reads /metrics every `every` seconds on a thread while a sweep runs (issue #24: the draft steps the server
    really used per batch size). Bounded: each read has a 5 s timeout, and the thread stops with the context."""

    def __init__(self, server: Server, every: float = 0.5) -> None:
        self.server, self.every, self.samples = server, every, list[GaugeSample]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GaugeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                m = self.server.metrics()
            except (OSError, ValueError):
                continue
            self.samples.append(
                GaugeSample(
                    time.monotonic(),
                    m.get("sglang:num_running_reqs", 0.0),
                    m.get("sglang:spec_num_steps", 0.0),
                    m.get("sglang:spec_num_draft_tokens", 0.0),
                    m.get("sglang:spec_accept_length", 0.0),
                )
            )


def steps_by_batch(samples: list[GaugeSample]) -> dict[int, dict[int, int]]:
    """How often each draft-step count was seen at each running batch size: {batch: {steps: samples}} (idle samples,
    batch 0, left out). A gauge is the value of the latest decode log line, so a sample right after a level changes
    can carry the previous level's steps: the counts show that, the majority is the slot's choice."""
    seen: dict[int, dict[int, int]] = {}
    for s in samples:
        batch = round(s.running)
        if batch > 0:
            row = seen.setdefault(batch, {})
            row[round(s.num_steps)] = row.get(round(s.num_steps), 0) + 1
    return dict(sorted(seen.items()))


@dataclass
class Server:
    name: str
    url: str
    log: Path
    launch: Path
    proc: subprocess.Popen[bytes]

    def lines(self) -> list[str]:
        return self.log.read_text(encoding="utf-8", errors="replace").splitlines()

    def metrics(self) -> dict[str, float]:
        """The /metrics samples without labels' detail: name -> sum over label sets (the bench's own parser)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            scrape = metrics.parse(response.read())
        values: dict[str, float] = {}
        for sample in scrape.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
        return values

    def info(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/server_info", timeout=10) as response:
            data: dict[str, Any] = json.loads(response.read())
        return data


def environment_file(path: Path) -> dict[str, str]:
    """The role's systemd EnvironmentFile (roles/sglang_server/templates/environment.j2: NAME="value" per line, the
    value's \\ " $ and ` escaped by a backslash), as the unit would load it."""
    env = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not (sep and name.isidentifier() and len(value) >= 2 and value[0] == value[-1] == '"'):
            raise ValueError(f'{path}:{number}: not NAME="value": {line!r}')
        env[name] = re.sub(r"\\(.)", r"\1", value[1:-1])
    return env


def port_of(url: str) -> int:
    return int(urllib.parse.urlsplit(url).port or 80)


def refuse_held_port(name: str, port: int) -> None:
    """Fail before the start when any process listens on the port: the new server could not bind it, and the health
    URL would answer from the other one (issue #39: a stale server measured in place of the new one)."""
    found = port_owner.listeners(port)
    if found:
        verdict = port_owner.before_start(found, port_owner.Owner("no process yet", None), port, f"the {name} server")
        pytest.fail(verdict.line)


def check_answerer(server: Server, port: int) -> None:
    """Fail unless the process answering on the port is the server's own process or one of its children; a server
    that exited while another answers names both."""
    owner = port_owner.tree_owner(server.proc.pid)
    found = port_owner.listeners(port)
    verdict = port_owner.serving(found, owner, port, f"the {server.name} server")
    if server.proc.poll() is not None:
        others = ", ".join(item.named for item in found) or "nothing"
        pytest.fail(
            f"the {server.name} server (pid {server.proc.pid}) exited {server.proc.returncode} while {others} answers "
            f"on port {port}:\n" + "\n".join(server.lines()[-30:])
        )
    if not verdict.ok:
        pytest.fail(verdict.line + "\n" + "\n".join(server.lines()[-30:]))


def bind_error(server: Server) -> str:
    """The server's bind error line ("" without one): it never served, whatever it printed after."""
    return next((line for line in server.lines() if startup_log.BIND_ERROR.search(line)), "")


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's whole process group, SIGKILL to what is left after 30 s; returns once no process of
    the group is left (bounded), so the next server finds the port free even where a child held its socket."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader
            if not server_pids.group_running(proc.pid):
                return
            time.sleep(0.2)


def refuse_busy_gpu(name: str) -> None:
    """Before a server starts: processes on the GPU (a server of another call, or one whose memory the driver has not
    released yet) are waited for, bounded, and then named; a server started beside them loads short of memory."""
    # this pytest's own CUDA context (a GPU test before this one) is no server
    listed = (server_pids.gpu_pids() or set()) - {os.getpid()}
    if not listed:
        return
    held, seen = server_pids.wait_gpu_released(listed)
    if held:
        pytest.fail(
            f"the {name} server was not started: {seen}. Stop those processes (`python3 tests/lab/server_pids.py "
            "stop --all` stops the servers this harness recorded; `nvidia-smi --query-compute-apps=pid,used_memory "
            "--format=csv` lists them)"
        )


def start(name: str, launch: Path, wait: dict[str, Any] | None = None) -> Generator[Server, None, None]:
    """Start the server from the role's launch command and its environment file (NAME.env beside NAME.txt), and wait
    as the role does (its health URL, retries x delay), polling more often; stop its whole process group afterwards.
    The port must be free before the start, and healthy means this server's own process answers. The server is
    recorded in the state file (tests/lab/server_pids.py) until it is stopped, so a killed pytest leaves none."""
    argv = shlex.split(launch.read_text())  # the stack venv's python (scripts/device/sglang_stack.py install)
    unit_env = environment_file(launch.with_suffix(".env"))
    save(f"{name}-environment.json", unit_env)
    env = {**child_env(), **unit_env, **SAFE_ENV}  # the file wins, as in the unit; multicast stays off regardless
    wait = wait if wait is not None else json.loads((LAUNCH / "wait.json").read_text())
    port = port_of(wait["health_url"])
    for line in server_pids.stop_recorded():  # what an earlier call killed before its cleanup left
        print(f"server_pids: {line}", file=sys.stderr)
    refuse_held_port(name, port)
    refuse_busy_gpu(name)
    log = OUT / f"{name}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server_pids.record(proc.pid, argv)
    server = Server(name, wait["health_url"].rsplit("/health", 1)[0], log, launch, proc)
    deadline = time.monotonic() + int(wait["retries"]) * int(wait["delay"])
    try:
        while True:
            if proc.poll() is not None:
                if port_owner.listeners(port):
                    check_answerer(server, port)  # names the server that exited and the one answering
                pytest.fail(
                    f"{name} server exited {proc.returncode} while starting:\n" + "\n".join(server.lines()[-30:])
                )
            if failed := bind_error(server):
                pytest.fail(f"{name} server could not bind port {port} ({failed.strip()}): another process holds it")
            try:
                with urllib.request.urlopen(wait["health_url"], timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{name} server not healthy within the role's bound:\n" + "\n".join(server.lines()[-30:]))
            time.sleep(2)
        check_answerer(server, port)
        wait_for_http_workers(server, deadline)
        yield server
    finally:
        stop_group(proc)
        server_pids.forget(proc.pid)
        save(f"{name}-server_log_tail.txt", "\n".join(server.lines()[-200:]))


def wait_for_http_workers(server: Server, deadline: float) -> None:
    """Where the launch asked for several HTTP processes, wait (to the start's own bound) until every one has started;
    fail naming what uvicorn's supervisor did where it killed one after the server was ready or they did not start."""
    while (workers := http_workers.scan(server.lines())) is not None and workers.serving < workers.asked:
        if workers.problem:
            pytest.fail(f"{server.name} server: {workers.problem}")
        if time.monotonic() > deadline:
            pytest.fail(f"{server.name} server: within the role's bound only {workers.note}")
        time.sleep(1)


def verify(server: Server, launch: str) -> tuple[int, dict[str, str], dict[str, Any]]:
    run = sm120check(
        "sglang", "verify-launch", "--json", "--launch-command", str(LAUNCH / launch), "--url", server.url,
        "--log", str(server.log),
    )  # fmt: skip
    report: dict[str, Any] = json.loads(run.stdout)
    save(f"verify-{server.name}-{launch.removesuffix('.txt')}.json", report)
    return run.returncode, {v["expectation"]: v["verdict"] for v in report["verdicts"]}, report


@dataclass(frozen=True)
class Level:
    concurrency: int
    record: dict[str, Any]
    server_tokens: float  # generation_tokens_total's growth over the level
    server_prompt: float
    server_cached: float
    server_verify: float  # spec_verify_calls_total's growth
    view: decode_log.LevelView | None  # the server's steady decode lines at this concurrency (decode-only rate)
    rate: decode_log.LevelRate | None  # the server's own throughput over the level's decode lines


def bench_level(server: Server, api: str, concurrency: int, label: str) -> Level:
    out = OUT / f"bench-{server.name}-{api}.jsonl"
    before, mark = server.metrics(), len(server.lines())
    run = sm120check(
        "bench", "--url", server.url, "--api", api, "--concurrency", str(concurrency), "--input-len", "64",
        "--output-len", "128", "--duration", str(LEVEL_S), "--min-lifetimes", str(MIN_LIFETIMES), "--label", label,
        "--out", str(out),
        "--level-timeout", "240", "--quiet",
        timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    after = server.metrics()
    record: dict[str, Any] = json.loads(out.read_text().splitlines()[-1])

    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    rows = decode_log.parse(server.lines())
    interval = int(server.info().get("decode_log_interval") or 40)
    views = decode_log.server_view(rows, after=mark)
    return Level(
        concurrency,
        record,
        grew("sglang:generation_tokens_total"),
        grew("sglang:prompt_tokens_total"),
        grew("sglang:cached_tokens_total"),
        grew("sglang:spec_verify_calls_total"),
        views.get(concurrency),
        decode_log.level_rate(rows, after=mark, interval=interval),
    )


def check_level(level: Level) -> list[str]:
    """What differs between the bench and the server at one level (empty: they agree)."""
    rec, problems = level.record, []
    rows = rec.get("per_request") or []
    tokens = sum(int(r["output_tokens"]) for r in rows)
    if rec["errors"]:
        problems.append(f"{rec['errors']} errors")
    if tokens != level.server_tokens:
        problems.append(f"bench counted {tokens} output tokens, the server generated {level.server_tokens:.0f}")
    if level.server_prompt and level.server_cached / level.server_prompt > 0.05:
        problems.append(f"prompt cache hits {level.server_cached:.0f}/{level.server_prompt:.0f} tokens")
    if (rec.get("cached_prompt_fraction") or 0.0) > 0.05:
        problems.append(f"the bench saw cached_prompt_fraction {rec['cached_prompt_fraction']}")
    problems += window_problems(rec)
    return problems


def window_problems(rec: dict[str, Any]) -> list[str]:
    """The bench's window throughput against the server's generation counter over the same window, where the window
    spans enough request lifetimes for a completion counter to judge (bench/server_rate.py MIN_LIFETIMES) and
    outside what the counter's samples around the window's edges allow (widened by the tolerance); shorter windows
    are reported in the level table as not judged, never called agreement."""
    server, lifetimes = rec.get("server_window_tok_s"), rec.get("window_lifetimes")
    span = rec.get("server_window_tok_s_range")
    if server is None or span is None:
        return ["the bench recorded no server counter over its window"]
    if lifetimes is not None and lifetimes >= MIN_LIFETIMES and outside(rec["throughput_tok_s"], tuple(span)):
        return [
            f"throughput {rec['throughput_tok_s']:.1f} tok/s against the server's counter {server:.1f} "
            f"({span[0]:.1f}-{span[1]:.1f} between its samples) over the same window ({lifetimes:.1f} lifetimes)"
        ]
    return []


def judged(rec: dict[str, Any]) -> bool:
    return (rec.get("window_lifetimes") or 0.0) >= MIN_LIFETIMES


def level_table(levels: list[Level]) -> list[dict[str, object]]:
    """What the record keeps of each level: the bench's figures beside the server's."""
    return [
        {
            "concurrency": lv.concurrency,
            "bench_tok_s": lv.record["throughput_tok_s"],
            "server_window_tok_s": lv.record.get("server_window_tok_s"),
            "server_window_tok_s_range": lv.record.get("server_window_tok_s_range"),
            "window_lifetimes": lv.record.get("window_lifetimes"),
            "counter_judged": judged(lv.record),
            "server_log_tok_s": None if lv.rate is None else round(lv.rate.tok_s, 1),
            "server_steady_decode_tok_s": None if lv.view is None else lv.view.gen_tok_s,
            "bench_tokens": sum(int(r["output_tokens"]) for r in lv.record.get("per_request") or []),
            "server_tokens": lv.server_tokens,
            "server_cached_prompt_tokens": lv.server_cached,
            "server_prompt_tokens": lv.server_prompt,
            "bench_accept_length": lv.record.get("accept_length"),
            "server_accept_length": lv.server_tokens / lv.server_verify if lv.server_verify else None,
            "server_log_accept_length": None if lv.view is None else lv.view.accept_length,
            "problems": check_level(lv),
        }
        for lv in levels
    ]
