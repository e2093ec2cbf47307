"""Issue #33 on a real SGLang 0.5.16 server, in three calls on one warm machine: the five curves at the account's
levels.

`scripts/device/sglang-server.sh venv envelope-a` patches SGLang with `--plain-decode` and sweeps the plain server
(base.txt) and EAGLE-3 at 3 steps (spec-uncapped.txt); `envelope-b` EAGLE-3 at 7 steps (spec-7-uncapped.txt), all
uncapped (the switch is in the tree but stays off in them: no threshold, no 0-step slot, no plain batch in their
logs), then builds the tiers from the three sweeps (sm120check.bench.tiers, the switch known from the patch state),
starts the static launch that realises them (switch-7.txt or switch.txt, whose threshold the role renders; this test
writes the measured one into a copy of its .env) and sweeps it, then sends it tests/lab/crossing.py's requests, whose
greedy outputs must equal the plain server's token for token (envelope-a kept those); `envelope-c` sweeps SGLang's
own adaptive mode with its defaults (sglang-adaptive.txt, the anchor) and writes the record: table.json, the five
curves' PNG where matplotlib is (the lent image has none: `python3 tests/gpu/test_sglang_envelope.py table.json
curves.png` draws it here), the batches the policy server ran plain and speculative per batch size, and the steady
decode rate at batch 30 and 100 beside the plain server's. Sweeps wait for the next call in /tmp/sm120kit-envelope.
The other phases (envelope-repeat, -spread, -gap, -profile, -host) are listed in scripts/device/sglang-server.sh.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import crossing, decode_log, gpu_clocks, host_profile, server_starts, trace_kernels
from lab.gpu_seconds import DECODE_COST, GAP_DEFAULT, decode_cost, gap_levels, per_token, where
from lab.sglang_gpu import (
    LAUNCH,
    MARKS,
    OUT,
    Patched,
    Server,
    child_env,
    environment_file,
    patch_tree,
    save,
    sm120check,
    start,
    write_models,
)
from sm120check.bench import tiers
from sm120check.bench.closedloop import COHORT_WARN
from sm120check.sglang import http_workers, plain_decode

pytestmark = MARKS
LEVELS = (1, 2, 5, 10, 30, 70, 100, 250)
LEVEL_S = 8
LIFETIMES = 10
SWEEPS = Path("/tmp/sm120kit-envelope")
CURVES = {"base": ("base.txt", 0), "spec-3": ("spec-uncapped.txt", 3), "spec-7": ("spec-7-uncapped.txt", 7)}
ENVELOPE = 0.05
# SM120KIT_ENVELOPE_SPREAD (bench --output-len-spread): each request's output length uniform in 128 x (1 +- it), the
# same draws for every server; 0 (fixed lengths) lets a closed loop refill in cohorts (docs/validation/
# 2026-12-06-h100-envelope). The envelope-spread phases sweep base and spec-7 only: the policy is planned from the
# curves this machine start measured, and the verdict compares with SGLang's adaptive mode only where it was swept.
SPREAD = os.environ.get("SM120KIT_ENVELOPE_SPREAD", "0")
# SM120KIT_ENVELOPE_REPEATS (1-5): sweeps per server in its one start; the curves are their means per level and the
# record keeps every sweep and the spread between them, so a miss can be told from the sweeps' own noise.
REPEATS = int(os.environ.get("SM120KIT_ENVELOPE_REPEATS", "1"))
# SM120KIT_ENVELOPE_STARTS (1-3): starts of each curve's, the policy's and SGLang's adaptive server, one after the
# other in one call, each swept REPEATS times; the curves are the means of every sweep, and the verdict's spread test
# then covers the spread between two starts of one launch, which the sweeps of one start do not.
STARTS = int(os.environ.get("SM120KIT_ENVELOPE_STARTS", "1"))
# SGLang's HTTP (tokenizer) processes of every server this file starts (`--tokenizer-worker-num`; 1, SGLang's default,
# leaves the launches as the role rendered them).
TOKENIZER_WORKERS = int(os.environ.get("SM120KIT_ENVELOPE_TOKENIZER_WORKERS", "1"))
# SM120KIT_ENVELOPE_DRAFT_ERROR (0 to below 1): the share of the synthetic draft's proposals that are wrong
# (tests/lab/sglang_models.py, --draft-error); 0.1, the pair every GPU test serves, gives a mean accept length of 5.7
# at 7 steps, 0.3 gives 3.1 (2.5 at 3 steps). Every server of one machine start must serve the same pair: the pair is
# rewritten when a call asks for another value.
DRAFT_ERROR_TEXT = os.environ.get("SM120KIT_ENVELOPE_DRAFT_ERROR", "0.1")
DRAFT_ERROR = float(DRAFT_ERROR_TEXT) if re.fullmatch(r"\d+(\.\d+)?", DRAFT_ERROR_TEXT) else -1.0
# SM120KIT_ENVELOPE_FRESH_CONNECTIONS (0 or 1; default 1 with several HTTP processes): the bench opens a connection
# for every request (bench --fresh-connections), so SGLang's HTTP processes, which share one listening socket, share
# the requests; with one keep-alive connection a worker a level's burst of connects can load one process with most
# of them.
FRESH_TEXT = os.environ.get("SM120KIT_ENVELOPE_FRESH_CONNECTIONS", "1" if TOKENIZER_WORKERS > 1 else "0")
FRESH = FRESH_TEXT == "1"
CONNECTIONS = ["--fresh-connections"] if FRESH else []
# SM120KIT_ENVELOPE_SERVER_ARGS: SGLang arguments every server of the run gets on top of its launch file (one
# string, shell words), e.g. "--enable-prefill-delayer --prefill-delayer-queue-min-ratio 0.1" to batch a plain
# server's prefills; the record's table names them.
try:
    SERVER_ARGS = shlex.split(os.environ.get("SM120KIT_ENVELOPE_SERVER_ARGS", ""))
except ValueError as exc:
    raise ValueError(f"SM120KIT_ENVELOPE_SERVER_ARGS: {exc}; quote it as a shell would") from None


def served(launch: Path) -> Path:
    """`launch` as this run starts it: with TOKENIZER_WORKERS > 1 or SERVER_ARGS a copy with them (and, for several
    HTTP processes, a copy of its environment file with uvicorn's health check as the role sets it), else `launch`."""
    if TOKENIZER_WORKERS == 1 and not SERVER_ARGS:
        return launch
    SWEEPS.mkdir(parents=True, exist_ok=True)
    copy = SWEEPS / f"{launch.stem}-served.txt"
    env = launch.with_suffix(".env").read_text(encoding="utf-8")
    extra = [*SERVER_ARGS]
    if TOKENIZER_WORKERS > 1:
        extra += ["--tokenizer-worker-num", str(TOKENIZER_WORKERS)]
        if http_workers.HEALTHCHECK_ENV not in env:
            env = env.rstrip("\n") + f'\n{http_workers.HEALTHCHECK_ENV}="{http_workers.HEALTHCHECK_S}"\n'
    copy.with_suffix(".env").write_text(env, encoding="utf-8")
    command = launch.read_text(encoding="utf-8").rstrip("\n")
    copy.write_text(f"{command} {shlex.join(extra)}\n", encoding="utf-8")
    return copy


if not 1 <= REPEATS <= 5:
    raise ValueError(f"SM120KIT_ENVELOPE_REPEATS={REPEATS}: expected 1 to 5 sweeps per server")
if not 1 <= STARTS <= 3:
    raise ValueError(f"SM120KIT_ENVELOPE_STARTS={STARTS}: expected 1 to 3 starts per server")
if TOKENIZER_WORKERS < 1:
    raise ValueError(f"SM120KIT_ENVELOPE_TOKENIZER_WORKERS={TOKENIZER_WORKERS}: expected 1 or more HTTP processes")
if FRESH_TEXT not in ("0", "1"):
    raise ValueError(f"SM120KIT_ENVELOPE_FRESH_CONNECTIONS={FRESH_TEXT!r}: expected 0 or 1")
if not 0 <= DRAFT_ERROR < 1:
    raise ValueError(
        f"SM120KIT_ENVELOPE_DRAFT_ERROR={DRAFT_ERROR_TEXT!r}: expected a share of wrong proposals from 0 to below 1"
    )


@pytest.fixture(scope="module")
def patched() -> Iterator[Patched]:
    run = sm120check("sglang", "patch", "--cc", "9.0", "--plain-decode", "--json")
    save("patch-plain-decode.json", run.stdout or run.stderr)
    assert run.returncode == 0, run.stderr[-2000:]
    yield patch_tree()
    sm120check("sglang", "patch", "--revert")


def starts(name: str, launch: Path) -> Iterator[tuple[int, Server]]:
    """The server of `launch` started STARTS times in turn (0-based index, the server), each stopped before the
    next; the logs of starts after the first are envelope-NAME-sN."""
    for i in range(STARTS):
        for server in start(f"envelope-{name}" + (f"-s{i + 1}" if i else ""), served(launch)):
            yield i, server


@contextlib.contextmanager
def gpu_sampled(path: Path) -> Iterator[None]:
    """sm120check.soak.sampler (NVML reads only, a line a second) appending to `path` while the block runs."""
    stop = path.with_suffix(".stop")
    stop.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "sm120check.soak.sampler", "--out", str(path), "--duration", "1200"]
    proc = subprocess.Popen(
        [*argv, "--stop", str(stop)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env()
    )
    try:
        yield
    finally:
        stop.touch()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def bench(server: Server, label: str, levels: tuple[int, ...], start_index: int, repeat: int, out: Path) -> str:
    """One sweep of `server` appended to `out`; its table."""
    run = sm120check(
        "bench", "--url", server.url, "--concurrency", ",".join(map(str, levels)), "--duration", str(LEVEL_S),
        "--input-len", "64", "--output-len", "128", "--min-lifetimes", str(LIFETIMES),
        "--label", server_starts.label_of(label, start_index, repeat),
        "--out", str(out), "--level-timeout", "120", "--output-len-spread", SPREAD, "--quiet", *CONNECTIONS,
        timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout + run.stderr


def sweep(server: Server, label: str, levels: tuple[int, ...] = LEVELS, start_index: int = 0) -> None:
    """REPEATS sweeps of `server`, appended to SWEEPS/LABEL.jsonl (emptied by the first start) under the bench labels
    of server_starts.label_of."""
    SWEEPS.mkdir(parents=True, exist_ok=True)
    out = SWEEPS / f"{label}.jsonl"
    clocks = SWEEPS / f"{label}-gpu.json"  # every start's levels: the GPU's clocks while each ran
    if start_index == 0:
        out.unlink(missing_ok=True)
        clocks.unlink(missing_ok=True)
    tag = f"-s{start_index + 1}" if start_index else ""
    sampled = OUT / f"gpu-samples-{label}{tag}.jsonl"
    sampled.unlink(missing_ok=True)
    workers = SWEEPS / f"{label}-http.json"  # every start's HTTP processes and uvicorn's kills during its sweeps
    if start_index == 0:
        workers.unlink(missing_ok=True)
    mark = len(server.lines())
    with gpu_sampled(sampled):  # every sweep appends its levels to `out`
        tables = [bench(server, label, levels, start_index, repeat, out) for repeat in range(REPEATS)]
    lines = server.lines()
    mine = mine_rows(out, label, start_index)
    batching = SWEEPS / f"{label}-prefills.json"  # every sweep's prefill batches per level (from the server's log)
    earlier = json.loads(batching.read_text()) if start_index and batching.is_file() else []
    prefills = [{"start": start_index + 1, "concurrency": int(r["concurrency"]), **prefill_row(lines, r)} for r in mine]
    batching.write_text(json.dumps(earlier + prefills), encoding="utf-8")
    seen = http_workers.scan(lines)
    if seen is not None:
        starts_seen = json.loads(workers.read_text()) if workers.is_file() else []
        row = {
            "start": start_index + 1,
            **seen.to_dict(),
            "killed_during_sweeps": http_workers.kills_between(lines, mark, len(lines)),
        }
        workers.write_text(json.dumps([*starts_seen, row]), encoding="utf-8")
    levels_seen = json.loads(clocks.read_text()) if clocks.is_file() else []
    gpu = gpu_clocks.samples(sampled.read_text().splitlines() if sampled.is_file() else [])
    clocks.write_text(json.dumps(levels_seen + gpu_clocks.per_level(gpu, mine)), encoding="utf-8")
    save(f"bench-{label}{tag}.txt", "\n".join(tables))
    views = decode_log.server_view(decode_log.parse(server.lines()))
    steady = {str(b): v.gen_tok_s for b, v in views.items()}
    (SWEEPS / f"{label}-steady.json").write_text(json.dumps(steady), encoding="utf-8")
    switch = plain_decode.evidence(server.lines())
    (SWEEPS / f"{label}-switch.json").write_text(json.dumps(switch.to_dict() if switch else None), encoding="utf-8")
    (OUT / f"sweep-{label}.jsonl").write_text(out.read_text(), encoding="utf-8")


def mine_rows(out: Path, label: str, start_index: int) -> list[dict[str, Any]]:
    """The bench rows of one start of `label` in `out`."""
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return [r for r in rows if server_starts.start_of(str(r["label"]), label) == start_index]


def prefill_row(lines: list[str], row: dict[str, Any]) -> dict[str, Any]:
    """The prefill batches the server logged inside one bench level's window, and the requests they took in."""
    b = decode_log.prefill_batching(lines, float(row["level_started_epoch"]), float(row["level_ended_epoch"]))
    return {"batches": b.batches, "requests": b.requests, "per_batch": b.per_batch}


def prefill_batching(label: str) -> dict[str, float | None]:
    """Per level, requests a prefill batch over every sweep of `label` (None where no prefill was logged)."""
    path = SWEEPS / f"{label}-prefills.json"
    totals: dict[int, list[int]] = {}
    for row in json.loads(path.read_text()) if path.is_file() else []:
        seen = totals.setdefault(int(row["concurrency"]), [0, 0])
        seen[0] += int(row["batches"])
        seen[1] += int(row["requests"])
    return {str(c): round(r / b, 2) if b else None for c, (b, r) in sorted(totals.items())}


def http_losses(label: str) -> str:
    """ " (...)" naming the starts of `label` whose sweeps ran while uvicorn killed HTTP processes or with fewer than
    launched ("" when none did): those sweeps measured a smaller server."""
    path = SWEEPS / f"{label}-http.json"
    lost = [r for r in (json.loads(path.read_text()) if path.is_file() else []) if r["killed_during_sweeps"]]
    said = ", ".join(
        f"start {r['start']}: {r['killed_during_sweeps']} killed, {r['serving']} of {r['asked']} serving" for r in lost
    )
    return f" ({label} lost HTTP processes during its sweeps: {said})" if lost else ""


def sweeps_of(label: str) -> dict[int, list[float]]:
    """Every sweep's output tok/s per level, in sweep order."""
    path = SWEEPS / f"{label}.jsonl"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run the envelope-curves phase first on this warm machine")
    out: dict[int, list[float]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out.setdefault(int(row["concurrency"]), []).append(float(row["throughput_tok_s"]))
    return out


def gpu_busy(label: str) -> dict[str, dict[str, float]]:
    """Per level, the last sweep's GPU seconds per forward kind (bench's server_forward_seconds) and its wall time."""
    return {str(c): rows[-1] for c, rows in gpu_busy_per_sweep(label).items()}


def gpu_busy_per_sweep(label: str) -> dict[int, list[dict[str, float]]]:
    """Per level, every sweep's GPU seconds per forward kind, its wall time and its output tokens, in sweep order."""
    out: dict[int, list[dict[str, float]]] = {}
    for line in (SWEEPS / f"{label}.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            busy = {k: float(v) for k, v in (row.get("server_forward_seconds") or {}).items()}
            wall = float(row["level_ended_epoch"]) - float(row["level_started_epoch"])
            every = row.get("per_request") or []  # the level's every request, ramp and drain included
            tokens = sum(int(r["output_tokens"]) for r in every) if every else int(row["output_tokens"])
            out.setdefault(int(row["concurrency"]), []).append(
                {**busy, "level_wall_s": round(wall, 3), "output_tokens": round(tokens)}
            )
    return out


def cohorts_of(label: str) -> dict[int, float]:
    """Per level, the largest `cohort_share` the bench recorded over the sweeps (absent before the bench kept it)."""
    out: dict[int, float] = {}
    for line in (SWEEPS / f"{label}.jsonl").read_text().splitlines():
        row = json.loads(line) if line.strip() else {}
        if row.get("cohort_share") is not None:
            c = int(row["concurrency"])
            out[c] = max(out.get(c, 0.0), float(row["cohort_share"]))
    return out


def same_launch_as_policy() -> str | None:
    """The swept curve whose server ran the policy server's command line and environment, if one did (a plan with no
    plain tier at one curve's steps): a gap between the two is the spread between two starts of one launch."""
    command, env = (SWEEPS / "policy.txt").read_text().split(), environment_file(SWEEPS / "policy.env")
    for name, (launch, _) in CURVES.items():
        path = LAUNCH / launch
        if swept(name) and path.read_text().split() == command and environment_file(path.with_suffix(".env")) == env:
            return name
    return None


def by_start(label: str) -> dict[int, dict[int, list[float]]]:
    rows = [json.loads(line) for line in (SWEEPS / f"{label}.jsonl").read_text().splitlines() if line.strip()]
    return server_starts.by_start(rows, label)


def accept_of(label: str) -> dict[str, float | None]:
    """Per level, the mean accept length the bench measured over the sweeps (None where the server gave none)."""
    seen: dict[str, list[float]] = {}
    for line in (SWEEPS / f"{label}.jsonl").read_text().splitlines():
        if line.strip() and (row := json.loads(line)).get("accept_length") is not None:
            seen.setdefault(str(row["concurrency"]), []).append(float(row["accept_length"]))
    return {str(c): round(sum(v) / len(v), 3) if (v := seen.get(str(c))) else None for c in LEVELS}


def curve(label: str) -> dict[int, float]:
    """The mean of the sweeps per level."""
    return {c: sum(v) / len(v) for c, v in sweeps_of(label).items()}


def sweep_spread(label: str) -> dict[str, float]:
    """Per level, (max - min) / mean over the sweeps (0 for one sweep)."""
    return {str(c): (max(v) - min(v)) / (sum(v) / len(v)) for c, v in sweeps_of(label).items()}


def swept(label: str) -> bool:
    return (SWEEPS / f"{label}.jsonl").is_file()


def switch_of(label: str) -> dict[str, Any] | None:
    raw: dict[str, Any] | None = json.loads((SWEEPS / f"{label}-switch.json").read_text())
    return raw


class TestEnvelopeCurves:
    @pytest.mark.parametrize("name", list(CURVES))
    def test_sweep(self, patched: Patched, name: str) -> None:
        write_models("spec.txt", draft_error=DRAFT_ERROR)
        switched = []  # each start's switch evidence: it stays off without a threshold or 0 slot
        for i, server in starts(name, LAUNCH / CURVES[name][0]):
            sweep(server, name, start_index=i)
            switched.append(switch_of(name))
            if name == "base" and i == 0:  # the greedy outputs the policy server must equal, token for token
                (SWEEPS / "base-outputs.json").write_text(json.dumps(crossing.outputs(server)), encoding="utf-8")
        assert set(curve(name)) == set(LEVELS)
        assert all(found is None or not found["plain"] for found in switched), switched


class TestEnvelopePolicy:
    def test_sweep_the_policy_server(self, patched: Patched) -> None:
        write_models("spec.txt", draft_error=DRAFT_ERROR)
        sweeps = [tiers.Sweep(name, steps, curve(name)) for name, (_, steps) in CURVES.items() if swept(name)]
        scan = sm120check("sglang", "scan", "--cc", "9.0", "--plain-decode", "--json")
        switch = bool(json.loads(scan.stdout)["plain_decode"]["applied"])  # the patch state, never a guess
        plan = tiers.plan(sweeps, switch=switch)
        launch = tiers.static_launch(plan)
        config = tiers.sglang_config(plan)
        name = "switch-7" if launch.steps == 7 else "switch"
        env = (LAUNCH / f"{name}.env").read_text(encoding="utf-8")
        threshold = f'SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS="{launch.plain_from}"'
        env = env.replace('SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS="30"', threshold if launch.plain_from else "")
        SWEEPS.mkdir(parents=True, exist_ok=True)
        (SWEEPS / "policy.txt").write_text((LAUNCH / f"{name}.txt").read_text(), encoding="utf-8")
        (SWEEPS / "policy.env").write_text(env, encoding="utf-8")
        save(
            "policy-plan.json",
            {
                "levels": [{"level": lv.level, "steps": lv.steps, "measured": lv.measured} for lv in plan.levels],
                "tiers": [{"start": t.start, "steps": t.steps} for t in plan.tiers],
                "sglang_config": config,
                "static": {"steps": launch.steps, "plain_from": launch.plain_from, "lost": launch.lost},
                "launch": name,
                "env": env,
                "notes": plan.notes,
            },
        )
        base = json.loads((SWEEPS / "base-outputs.json").read_text())
        differs: dict[str, Any] = {}
        evidence: list[dict[str, Any] | None] = []  # each start's switch counts
        for i, server in starts("policy", SWEEPS / "policy.txt"):
            sweep(server, "policy", start_index=i)
            differs.update(
                {f"start {i + 1}: {k}": v for k, v in crossing.differ(base, crossing.outputs(server)).items()}
            )
            found = plain_decode.evidence(server.lines())
            evidence.append(found.to_dict() if found else None)
        save("policy-outputs.json", {"differ": differs, "switch": evidence[-1], "switch_by_start": evidence})
        assert set(curve("policy")) == set(LEVELS)
        assert not differs, f"the policy server's greedy outputs differ from the plain server's: {differs}"

    def test_sweep_sglangs_adaptive_mode(self, patched: Patched) -> None:
        write_models("spec.txt", draft_error=DRAFT_ERROR)
        for i, server in starts("sglang-adaptive", LAUNCH / "sglang-adaptive.txt"):
            sweep(server, "sglang-adaptive", start_index=i)
        assert set(curve("sglang-adaptive")) == set(LEVELS)

    def test_the_policy_is_on_the_envelope_and_beats_sglangs_adaptive(self) -> None:
        from lab.sglang_models import expected_accept_length  # imports torch: here, not at collection

        names = [n for n in ("base", "spec-3", "spec-7", "sglang-adaptive", "policy") if swept(n)]
        assert {"base", "policy"} <= set(names) and set(names) & {"spec-3", "spec-7"}, names
        curves = {n: curve(n) for n in names}
        rows = {n: [round(curves[n][c], 1) for c in LEVELS] for n in names}
        table: dict[str, Any] = {
            "levels": list(LEVELS),
            "output_len_spread": float(SPREAD),
            "draft_error": DRAFT_ERROR,
            "server_args": SERVER_ARGS,
            "tokenizer_workers": TOKENIZER_WORKERS,
            "fresh_connections": FRESH,
            "accept_length_expected": {str(k): round(expected_accept_length(DRAFT_ERROR, k), 3) for k in (3, 7)},
            "accept_length": {n: accept_of(n) for n in names},
            "sweeps_per_server": {n: len(sweeps_of(n)[LEVELS[0]]) for n in names},
            "starts_per_server": {n: len(by_start(n)) for n in names},
            "curves": rows,
        }
        steady = {n: json.loads((SWEEPS / f"{n}-steady.json").read_text()) for n in ("base", "policy")}
        step = {
            str(b): {
                "plain_server_tok_s": steady["base"].get(str(b)),
                "policy_server_tok_s": steady["policy"].get(str(b)),
            }
            for b in (30, 100)
        }
        misses = []
        # the switched decode's cost from the device timer, at the levels whose batches the policy ran plain
        cost = {
            str(lv): decode_cost(gpu_busy_per_sweep("policy")[lv], gpu_busy_per_sweep("base")[lv]) for lv in (30, 100)
        }
        for at, ratio in cost.items():
            if ratio is not None and ratio > DECODE_COST:
                misses.append(f"C={at}: the switched decode costs {ratio:.2f} x the plain server's GPU time a token")
        twin = same_launch_as_policy()
        for i, c in enumerate(LEVELS):
            envelope = max(curves[n][c] for n in ("base", "spec-3", "spec-7") if n in curves)
            if curves["policy"][c] < (1 - ENVELOPE) * envelope:
                best = max((n for n in ("base", "spec-3", "spec-7") if n in curves), key=lambda n: curves[n][c])
                # with repeated sweeps: does the policy's best sweep reach 95 % of that curve's worst one?
                overlap = max(sweeps_of("policy")[c]) >= (1 - ENVELOPE) * min(sweeps_of(best)[c])
                repeated = len(sweeps_of("policy")[c]) > 1 or len(sweeps_of(best)[c]) > 1
                noise = f" (within the sweeps' spread: {overlap})" if repeated else ""
                if best == twin:
                    noise += f" (the same launch as {best}: a gap between two starts of one server)"
                noise += "".join(http_losses(n) for n in ("policy", best))
                cause = where(gpu_busy_per_sweep("policy")[c], gpu_busy_per_sweep(best)[c])
                batched = [prefill_batching(n).get(str(c)) for n in ("policy", best)]
                if None not in batched:
                    cause += f"; prefills: {batched[0]} requests a batch against {batched[1]}"
                if (share := cohorts_of("policy").get(c)) is not None and share >= COHORT_WARN:
                    cause += f"; cohorts: {share:.0%} of C finished within 5 % of a lifetime of each other"
                misses.append(
                    f"C={c}: policy {curves['policy'][c]:.0f} < 95 % of the envelope {envelope:.0f} ({best}){noise}; "
                    + cause
                )
            if "sglang-adaptive" in curves and curves["policy"][c] < curves["sglang-adaptive"][c]:
                anchor = curves["sglang-adaptive"][c]
                reach = max(sweeps_of("policy")[c]) >= min(sweeps_of("sglang-adaptive")[c])
                misses.append(
                    f"C={c}: policy {curves['policy'][c]:.0f} < SGLang adaptive {anchor:.0f}"
                    f" (the policy's best sweep reaches its worst: {reach})"
                )
            assert rows["policy"][i] == round(curves["policy"][c], 1)
        record = {
            **table,
            "sweeps": {n: {str(c): v for c, v in sweeps_of(n).items()} for n in names},
            "sweep_spread": {n: sweep_spread(n) for n in names},
            "sweeps_by_start": {n: {str(k + 1): per for k, per in by_start(n).items()} for n in names},
            "start_spread": {n: server_starts.start_spread(by_start(n)) for n in names},
            "policy_same_launch_as": twin,
            "gpu_clocks": {n: json.loads(f.read_text()) for n in names if (f := SWEEPS / f"{n}-gpu.json").is_file()},
            "http_workers": {n: json.loads(f.read_text()) for n in names if (f := SWEEPS / f"{n}-http.json").is_file()},
            "prefill_batching": {n: prefill_batching(n) for n in names},
            "step_at_batch": step,
            "decode_cost": cost,
            "gpu_seconds": {n: gpu_busy(n) for n in names},
            "policy_batches": switch_of("policy"),
            "misses": misses,
        }
        save("table.json", table)
        save("envelope-verdict.json", record)
        if importlib.util.find_spec("matplotlib") is not None:
            plot(table, OUT / "curves.png")
        assert not misses, misses


# The gap phase: the plain server against the switch-7 launch at the levels above the crossing only, with each level's
# GPU seconds per forward kind, so a policy that falls short of the plain server there is told apart: GPU work it adds
# (extend, decode) or host time between forwards (the wall time the GPU did not compute).
# SM120KIT_ENVELOPE_GAP_LEVELS (comma-separated, a subset of GAP_DEFAULT) narrows the sweep for a short device budget.
GAP_LEVELS = gap_levels(os.environ.get("SM120KIT_ENVELOPE_GAP_LEVELS", ",".join(map(str, GAP_DEFAULT))))
# The switch-7 launch's threshold; the default is the crossing tiers.plan found for the synthetic pair on one GPU.
PLAIN_FROM = int(os.environ.get("SM120KIT_ENVELOPE_PLAIN_FROM", "57"))


def gap_launch(name: str) -> Path:
    """The plain server's launch for gap-base; for gap-policy the switch-7 launch with its threshold at PLAIN_FROM."""
    if name == "gap-base":
        return served(LAUNCH / "base.txt")
    SWEEPS.mkdir(parents=True, exist_ok=True)
    env = (LAUNCH / "switch-7.env").read_text(encoding="utf-8")
    threshold = f'SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS="{PLAIN_FROM}"'
    (SWEEPS / "gap-policy.env").write_text(env.replace('SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS="30"', threshold), "utf-8")
    launch = SWEEPS / "gap-policy.txt"
    launch.write_text((LAUNCH / "switch-7.txt").read_text(), encoding="utf-8")
    return served(launch)


class TestEnvelopeGap:
    @pytest.mark.parametrize("name", ["gap-base", "gap-policy"])
    def test_sweep_above_the_crossing(self, patched: Patched, name: str) -> None:
        write_models("spec.txt", draft_error=DRAFT_ERROR)
        for server in start(f"envelope-{name}", gap_launch(name)):
            sweep(server, name, GAP_LEVELS)
        assert set(curve(name)) == set(GAP_LEVELS)
        found = switch_of(name)
        if name == "gap-policy":  # every batch at or above the threshold ran plain, none below it
            assert found is not None, "the policy server's log has no count line of the switch"
            plain = {int(b) for b in found["plain"]}
            assert plain and min(plain) >= PLAIN_FROM, found
            assert all(int(b) < PLAIN_FROM for b in found["speculative"]), found
            assert found["draft_prefills_skipped"] > 0, f"no prefill skipped the draft's extend: {found}"
        else:
            assert found is None or not found["plain"], found

    def test_the_policy_keeps_the_plain_servers_rate_above_the_crossing(self) -> None:
        base, policy = sweeps_of("gap-base"), sweeps_of("gap-policy")
        busy = {n: gpu_busy_per_sweep(n) for n in ("gap-base", "gap-policy")}

        levels = {}
        misses = []
        for c in GAP_LEVELS:
            mean_b, mean_p = sum(base[c]) / len(base[c]), sum(policy[c]) / len(policy[c])
            levels[str(c)] = {
                "base_tok_s": base[c],
                "policy_tok_s": policy[c],
                "policy_over_base": round(mean_p / mean_b, 4),
                "base_per_token": per_token(busy["gap-base"][c]),
                "policy_per_token": per_token(busy["gap-policy"][c]),
            }
            if c >= PLAIN_FROM and mean_p < (1 - ENVELOPE) * mean_b:
                cause = where(busy["gap-policy"][c], busy["gap-base"][c])
                misses.append(f"C={c}: policy {mean_p:.0f} < 95 % of the plain server's {mean_b:.0f}; {cause}")
        logs = {n: server_log_rates(OUT / f"envelope-{n}.log") for n in ("gap-base", "gap-policy")}
        save("gap.json", {"plain_from": PLAIN_FROM, "sweeps_per_server": REPEATS, "levels": levels,
                          "server_logs": logs, "misses": misses})  # fmt: skip
        assert not misses, misses


# The profile phase: the gap load at its top level, SGLang's own profiler asked PROFILE_AT seconds into it for
# PROFILE_STEPS scheduler steps (host with its Python stack, and GPU), on each server of the gap: the GPU's idle time
# within the traced span, the kernels and the host's own time per Python function, op and CUDA call, per step.
PROFILE_C = max(GAP_DEFAULT)
PROFILE_S = 36
PROFILE_AT = (8.0, 16.0, 24.0)
PROFILE_STEPS = 12
STEP = ": run_batch"  # the scheduler's step in the trace's Python events (scheduler.py(<line>): run_batch)


def ask_profiles(url: str, folder: Path, name: str, stop: threading.Event, replies: list[str]) -> None:
    """POST /start_profile (PROFILE_STEPS steps, host and GPU activity) at each of PROFILE_AT seconds; each reply
    kept."""
    began = time.monotonic()
    for i, at in enumerate(PROFILE_AT):
        if stop.wait(max(0.0, at - (time.monotonic() - began))):
            return
        body = {"output_dir": str(folder), "num_steps": PROFILE_STEPS, "activities": ["CPU", "GPU"],
                "with_stack": True, "profile_id": f"{name}-{i}"}  # fmt: skip
        request = urllib.request.Request(
            f"{url}/start_profile", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                replies.append(f"{at:g} s: HTTP {reply.status} {reply.read(300).decode(errors='replace').strip()}")
        except OSError as exc:  # URLError and timeouts are OSErrors
            replies.append(f"{at:g} s: {exc}")


def profile_traces(folder: Path, deadline_s: float = 60.0) -> list[Path]:
    """The traces the profiler wrote into `folder`, once every one of them reads as a whole trace (bounded)."""
    end = time.monotonic() + deadline_s
    while True:
        found = sorted(folder.glob("*.trace.json.gz"))
        try:
            for path in found:
                trace_kernels.load(path)
            if len(found) >= len(PROFILE_AT) or time.monotonic() > end:
                return found
        except (OSError, EOFError, ValueError):  # still being written
            if time.monotonic() > end:
                return found
        time.sleep(2.0)


def load_args(server: Server, level: int, seconds: int, label: str, out: Path) -> list[str]:
    """`sm120check bench` at one level for the profile and host phases: the sweeps' request shape, one window."""
    return ["bench", "--url", server.url, "--concurrency", str(level), "--duration", str(seconds), "--input-len", "64",
            "--output-len", "128", "--output-len-spread", SPREAD, "--label", label, "--out", str(out),
            "--level-timeout", "120", "--quiet", *CONNECTIONS]  # fmt: skip


class TestEnvelopeProfile:
    @pytest.mark.parametrize("name", ["gap-base", "gap-policy"])
    def test_profile_the_steps_under_the_gap_load(self, patched: Patched, name: str) -> None:
        write_models("spec.txt", draft_error=DRAFT_ERROR)
        folder = OUT / f"profile-{name}"
        shutil.rmtree(folder, ignore_errors=True)
        replies: list[str] = []
        for server in start(f"profile-{name}", gap_launch(name)):
            stop = threading.Event()
            asker = threading.Thread(target=ask_profiles, args=(server.url, folder, name, stop, replies), daemon=True)
            asker.start()
            try:
                run = sm120check(*load_args(server, PROFILE_C, PROFILE_S, name, SWEEPS / f"profile-{name}.jsonl"),
                                 timeout=600)  # fmt: skip
            finally:
                stop.set()
                asker.join(timeout=60)
            traces = profile_traces(folder)
            windows = decode_log.profiled_prefills(server.lines())
            switch = plain_decode.evidence(server.lines())
        save(f"profile-{name}.json", {
            "bench": run.stdout[-2000:], "replies": replies, "prefills_per_window": windows,
            "switch": switch.to_dict() if switch else None, "traces": [trace_summary(p) for p in traces],
        })  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        assert traces, f"no trace in {folder}; the profiler's replies: {replies}"
        if name == "gap-policy":  # under this load the batches decode plain, so most prefills skip the draft
            assert switch is not None and switch.draft_prefills_skipped > 0, switch

    def test_the_profiles_side_by_side(self) -> None:
        """profile-gap.json: per scheduler step, the kernels, the host's own time and its part while the GPU idled,
        the CUDA calls, and each trace's GPU idle share. A report: the windows catch different mixes of prefill,
        decode and waits between cohorts, and the Python tracer slows both hosts, so no rate is held here (the
        switch's prefill guard is held by the count line above and by TestEnvelopeGap)."""
        runs = {n: json.loads((OUT / f"profile-{n}.json").read_text()) for n in ("gap-base", "gap-policy")}
        steps = {n: [t["steps"] for t in r["traces"]] for n, r in runs.items()}
        assert all(v and all(v) for v in steps.values()), f"a server without a trace of scheduler steps: {steps}"

        def per_step(key: str, name: str) -> list[dict[str, float]]:
            return [{k: v / t["steps"] for k, v in t[key].items()} for t in runs[name]["traces"]]

        found = {key: trace_kernels.compare(per_step(key, "gap-base"), per_step(key, "gap-policy"), top=30)
                 for key in ("kernel_ms", "host_self_ms", "idle_blame_ms", "runtime_ms")}  # fmt: skip
        timeline = {n: [t["gpu"] for t in r["traces"]] for n, r in runs.items()}
        idle = {n: sum(t["idle_ms"] for t in v) / max(1e-9, sum(t["span_ms"] for t in v)) for n, v in timeline.items()}
        save("profile-gap.json", {"unit": "ms per scheduler step", "gpu_idle_share": idle, "gpu_timeline": timeline,
                                  "steps": steps, **found})  # fmt: skip


# The host phase: the gap's two servers under the cohort load at its top level, each server process's CPU time per
# thread and py-spy's Python stacks over one window (tests/lab/host_profile.py), and the bench client's the same: which
# process limits the load where the GPU waits between cohorts (the scheduler's own steps are TestEnvelopeProfile's).
HOST_C = max(GAP_DEFAULT)
HOST_S = 30  # the bench's steady window at HOST_C
HOST_AT = 12.0  # seconds after the bench starts when the window opens (past the ramp)
HOST_WINDOW = 10.0
HOST_ROLES = ("main", "scheduler", "detokenizer", "bench")


def host_role(role: str) -> str:
    """SGLang's titles carry the rank (scheduler_TP0): the role without it."""
    return role.split("_")[0]


def timed_scrapes(url: str, n: int = 5) -> list[dict[str, float]]:
    """`n` reads of /metrics under the load, each one's bytes and seconds (the bench reads it every 0.25 s, and SGLang
    builds the page in its HTTP process); a failed read is kept with its seconds and 0 bytes."""
    out = []
    for _ in range(n):
        began = time.monotonic()
        try:
            with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
                size = len(response.read())
        except OSError:
            size = 0
        out.append({"bytes": size, "seconds": round(time.monotonic() - began, 4)})
        time.sleep(0.2)
    return out


class TestEnvelopeHost:
    @pytest.mark.parametrize("name", ["gap-base", "gap-policy"])
    def test_profile_the_host_under_the_cohort_load(self, patched: Patched, name: str) -> None:
        write_models("spec.txt", draft_error=DRAFT_ERROR)
        folder = OUT / f"host-{name}"
        shutil.rmtree(folder, ignore_errors=True)
        profiles: list[host_profile.ProcessProfile] = []
        scrapes: list[dict[str, float]] = []
        SWEEPS.mkdir(parents=True, exist_ok=True)
        (SWEEPS / f"host-{name}.jsonl").unlink(missing_ok=True)  # the bench appends
        for server in start(f"host-{name}", gap_launch(name)):
            cmd = [
                sys.executable,
                "-m",
                "sm120check",
                *load_args(server, HOST_C, HOST_S, name, SWEEPS / f"host-{name}.jsonl"),
            ]
            bench = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
            try:
                try:
                    bench.wait(timeout=HOST_AT)  # returns early only when the bench failed to start its load
                except subprocess.TimeoutExpired:
                    pids = {**host_profile.processes(server.proc.pid), bench.pid: "bench"}
                    profiles = host_profile.profile(pids, HOST_WINDOW, folder)
                    scrapes = timed_scrapes(server.url)
                out, err = bench.communicate(timeout=600)
            finally:
                if bench.poll() is None:
                    bench.kill()
                    bench.wait(timeout=30)
            switch = plain_decode.evidence(server.lines())
        assert bench.returncode == 0, err[-2000:]
        (OUT / f"sweep-host-{name}.jsonl").write_text((SWEEPS / f"host-{name}.jsonl").read_text(), encoding="utf-8")
        assert profiles, f"the bench ended within {HOST_AT} s, before the window opened:\n{out[-2000:]}"
        save(f"host-{name}.json", {"bench": out[-3000:], "window_s": HOST_WINDOW, "level": HOST_C,
                                   "processes": host_profile.as_json(profiles), "metrics_scrapes": scrapes,
                                   "switch": switch.to_dict() if switch else None})  # fmt: skip
        roles = {host_role(p.role) for p in profiles}
        assert set(HOST_ROLES) <= roles, f"processes found under the server and the bench: {sorted(roles)}"

    def test_the_hosts_side_by_side(self) -> None:
        """host.json: per role, each server's CPU share, its busiest thread and py-spy's top frames, with the bench's
        rate and the timed /metrics reads on each server. A report; the run fails where a role's stacks could not be
        taken."""
        runs = {n: json.loads((OUT / f"host-{n}.json").read_text()) for n in ("gap-base", "gap-policy")}
        lines = {n: (SWEEPS / f"host-{n}.jsonl").read_text().splitlines() for n in runs}
        rates = {n: [json.loads(line)["throughput_tok_s"] for line in v if line.strip()] for n, v in lines.items()}
        table: dict[str, Any] = {"level": HOST_C, "window_s": HOST_WINDOW, "bench_tok_s": rates, "roles": {},
                                 "metrics_scrapes": {n: run["metrics_scrapes"] for n, run in runs.items()}}  # fmt: skip
        missing = []
        for role in HOST_ROLES:
            row = {}
            for n, run in runs.items():
                found = [p for p in run["processes"] if host_role(p["role"]) == role]
                if not found:
                    missing.append(f"{n}: no {role} process")
                    continue
                p = max(found, key=lambda q: q["cpu"]["share"])
                if p["stacks_error"]:
                    missing.append(f"{n} {role}: {p['stacks_error']}")
                stacks = p["stacks"] or {}
                row[n] = {"cpu_share": p["cpu"]["share"], "busiest_thread": p["cpu"]["busiest_thread"],
                          "busiest_share": p["cpu"]["busiest_share"], "own": stacks.get("own", [])[:12],
                          "inclusive": stacks.get("inclusive", [])[:12]}  # fmt: skip
            table["roles"][role] = row
        save("host.json", table)
        assert not missing, missing


def trace_summary(path: Path, top: int = 60) -> dict[str, Any]:
    """One trace: scheduler steps, kernel milliseconds by name, the GPU's span, busy and idle time, the host's own
    time by name and the part of it while the GPU idled (their `top` names), and its CUDA calls."""
    trace = trace_kernels.load(path)
    own, blame = trace_kernels.host_self(trace), trace_kernels.idle_blame(trace)
    return {
        "file": path.name,
        "steps": trace_kernels.count(trace, STEP),
        "kernel_ms": trace_kernels.totals(trace),
        "gpu": trace_kernels.gpu_time(trace),
        "host_self_ms": dict(sorted(own.items(), key=lambda kv: -kv[1])[:top]),
        "idle_blame_ms": dict(sorted(blame.items(), key=lambda kv: -kv[1])[:top]),
        "runtime_ms": trace_kernels.totals(trace, cats=trace_kernels.RUNTIME_CATS),
    }


def server_log_rates(log: Path) -> dict[str, Any]:
    """The server's own rates from its log: decode tokens/s at each gap level's running count (steady lines), and
    its full-chunk prefills' input tokens/s with at least PLAIN_FROM requests running."""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    chunk = next((int(m[1]) for m in map(re.compile(r"chunked_prefill_size=(\d+)").search, lines) if m), None)
    views = decode_log.server_view(decode_log.parse(lines))
    return {
        "decode_gen_tok_s": {str(c): views[c].gen_tok_s if c in views else None for c in GAP_LEVELS},
        "prefill": None if chunk is None else {"chunk": chunk, **decode_log.prefill_view(
            decode_log.parse_prefills(lines), chunk=chunk, min_running=PLAIN_FROM)},
    }  # fmt: skip


def plot(table: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = table["levels"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7), sharex=True, height_ratios=[3, 2])
    base = table["curves"]["base"]
    for i, (name, ys) in enumerate(table["curves"].items()):  # one colour per curve in both panels
        top.plot(levels, ys, marker="o", label=name, color=f"C{i}")
        if name != "base":
            bottom.plot(levels, [y / b for y, b in zip(ys, base, strict=True)], marker="o", color=f"C{i}")
    bottom.axhline(1.0, color="grey", linewidth=1)
    top.set_xscale("log")
    top.set_xticks(levels, [str(c) for c in levels])
    top.set_ylabel("output tok/s")
    bottom.set_ylabel("x the plain server")
    bottom.set_xlabel("concurrency")
    top.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":  # python3 tests/gpu/test_sglang_envelope.py table.json curves.png (where matplotlib is)
    plot(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
