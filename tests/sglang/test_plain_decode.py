"""The speculation switch (`sm120check sglang patch --plain-decode`) on the real 0.5.16 and 0.5.23 wheels' sources:
apply, idempotent, byte-identical revert, other releases refused, and every SGLang name the added methods use
present in the release they are added to (the GPU run, tests/gpu/test_sglang_switch.py, covers 0.5.16 at run time;
0.5.23 needs torch 2.11+ with its own pins, which the GPU image lacks)."""

from __future__ import annotations

import ast
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lab.sglang_releases import (
    earlier_edit_refused_until_reverted,
    git_apply,
    release_dir,
    run_cli,
    tree_hashes,
    upstream_diff,
)
from sm120check.sglang import plain_decode

pytestmark = pytest.mark.slow
SUPPORTED = plain_decode.SUPPORTED
ARGS = ("--cc", "12.0", "--flashinfer-version", "0.7.2", "--json")


def _copy(tmp_path: Path, version: str) -> Path:
    tree = tmp_path / version / "sglang"
    shutil.copytree(release_dir(version) / "sglang", tree)
    return tree


def _worker(tree: Path) -> str:
    return (tree / plain_decode.PATH).read_text(encoding="utf-8")


@pytest.mark.parametrize("version", SUPPORTED)
def test_switch_applies_once_and_reverts_byte_identical(tmp_path: Path, version: str) -> None:
    tree = _copy(tmp_path, version)
    before = tree_hashes(tree)
    status, out = run_cli("patch", "--source", str(tree), "--plain-decode", *ARGS)
    assert status == 0, out
    changed = {f["path"]: f["changes"] for f in json.loads(out)["files"]}
    assert any("speculation switch" in note for note in changed[plain_decode.PATH])
    text = _worker(tree)
    compile(text, plain_decode.PATH, "exec")
    assert plain_decode.applied(text)
    again = json.loads(run_cli("patch", "--source", str(tree), "--plain-decode", *ARGS)[1])
    assert again["files"] == [] and not again["needed"]
    scanned = json.loads(run_cli("scan", "--source", str(tree), "--plain-decode", *ARGS)[1])
    assert scanned["plain_decode"]["applied"] is True
    assert run_cli("patch", "--source", str(tree), "--revert", "--json")[0] == 0
    assert tree_hashes(tree) == before


@pytest.mark.parametrize("version", SUPPORTED)
def test_switch_guards_the_zero_step_branch_and_captures_at_init(version: str) -> None:
    text = plain_decode.add_switch(_worker(release_dir(version) / "sglang"), version)
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == plain_decode.WORKER)
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    forward = ast.get_source_segment(text, methods["forward_batch_generation"]) or ""
    guard = forward.index("self._sm120kit_plain_decode_wanted(batch)")
    assert guard < forward.index("self._build_trivial_verify_input(batch)")
    assert forward.index("self.activate_step_by_batch(") < guard  # the adaptive slot is chosen before the guard
    init = methods["init_cuda_graphs"].body[-1]
    assert "_sm120kit_plain_decode_init" in (ast.get_source_segment(text, init) or "")
    assert {"_sm120kit_plain_decode_init", "_sm120kit_plain_decode_wanted", "_sm120kit_plain_decode"} <= set(methods)


@pytest.mark.parametrize("version", SUPPORTED)
def test_switch_guards_the_draft_prefill_after_the_target_prefill(version: str) -> None:
    """The prefill guard returns before the draft's extend, after the target's prefill and its publish."""
    text = plain_decode.add_switch(_worker(release_dir(version) / "sglang"), version)
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == plain_decode.WORKER)
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    where = "_forward_prefill_batch" if "_forward_prefill_batch" in methods else "forward_batch_generation"
    body = ast.get_source_segment(text, methods[where]) or ""
    guard = body.index("self._sm120kit_skip_draft_prefill(batch)")
    assert body.index("on_publish(batch_output.new_seq_lens)") < guard < body.index("._draft_extend_for_prefill(")
    assert body.index("self.target_worker.forward_batch_generation(") < guard
    assert text.count("self._sm120kit_skip_draft_prefill(batch)") == 1
    assert {"_sm120kit_skip_draft_prefill", "_sm120kit_stub_draft_prefill"} <= set(methods)


def _skip_decision(version: str) -> Callable[[object, object], bool]:
    """The patch's `_sm120kit_skip_draft_prefill` with `_sm120kit_live_requests`, compiled from the patched worker
    on their own: decide(worker, batch)."""
    import textwrap

    text = plain_decode.add_switch(_worker(release_dir(version) / "sglang"), version)
    names = ("_sm120kit_skip_draft_prefill", "_sm120kit_live_requests")
    namespace: dict[str, Any] = {}
    for fn in (n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name in names):
        exec(textwrap.dedent(ast.get_source_segment(text, fn) or ""), namespace)  # our own patch's methods
    assert set(names) <= set(namespace), f"{version}: the patch lacks {names}"
    skip, live = namespace[names[0]], namespace[names[1]]

    def decide(worker: Any, batch: object) -> bool:
        worker._sm120kit_live_requests = lambda: live(worker)
        return bool(skip(worker, batch))

    return decide


class _Pool:
    """SGLang's ReqToTokenPool as the guard reads it: `size` slots, `available_size()` of them free (the class itself
    allocates its table on the GPU)."""

    def __init__(self, size: int, live: int) -> None:
        self.size, self.free_slots = size, list(range(1, size - live + 1))

    def available_size(self) -> int:
        return len(self.free_slots)


@pytest.mark.parametrize("version", SUPPORTED)
def test_a_prefill_skips_the_draft_only_when_the_batch_it_joins_decodes_plain(version: str) -> None:
    """The decision alone, on stand-ins for the worker, its request pool and the batch (SGLang's objects need its GPU
    runtime; the GPU run, tests/gpu/test_sglang_envelope.py, runs it in the server)."""
    from types import SimpleNamespace

    decide = _skip_decision(version)

    def batch(n: int, idle: bool = False) -> SimpleNamespace:
        return SimpleNamespace(seq_lens=SimpleNamespace(shape=(n,)), forward_mode=SimpleNamespace(is_idle=lambda: idle))

    def worker(min_bs: int | None, live: int, dp: bool = False) -> SimpleNamespace:
        return SimpleNamespace(
            _sm120kit_plain=("backend", "graphs"),
            _sm120kit_plain_min_bs=min_bs,
            req_to_token_pool=_Pool(256, live),
            server_args=SimpleNamespace(enable_dp_attention=dp),
        )

    # The pool's live slots already count the prefill's own requests (the scheduler allocates them before the run).
    assert decide(worker(30, 30), batch(5)) is True  # 25 running + 5 admitted reach 30
    assert decide(worker(30, 29), batch(4)) is False
    assert decide(worker(57, 60), batch(25)) is True  # a ramp's later chunk: the earlier chunks hold their slots
    assert decide(worker(57, 35), batch(25)) is False  # its first chunks: the draft still fills the prompts' KV
    assert decide(worker(30, 1), batch(1)) is False  # one request after an idle spell, whatever ran before
    assert decide(worker(None, 250), batch(250)) is False  # no threshold: adaptive or plain speculation
    assert decide(worker(30, 250), batch(8, idle=True)) is False
    assert decide(worker(30, 250, dp=True), batch(8)) is False
    assert decide(SimpleNamespace(_sm120kit_plain_min_bs=30), batch(40)) is False  # graphs never captured


def test_the_request_pool_the_guard_reads_is_sglangs() -> None:
    """`size` and `available_size()` as the guard reads them, on each supported release's ReqToTokenPool source."""
    for version in SUPPORTED:
        source = (release_dir(version) / "sglang" / "srt" / "mem_cache" / "memory_pool.py").read_text(encoding="utf-8")
        cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "ReqToTokenPool")
        init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
        available = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "available_size")
        assert "self.size = size" in (ast.get_source_segment(source, init) or ""), version
        assert "self.free_slots = list(range(1, self._alloc_size))" in (ast.get_source_segment(source, init) or "")
        assert "return len(self.free_slots)" in (ast.get_source_segment(source, available) or ""), version
        assert "self._alloc_size = size + 1" in (ast.get_source_segment(source, init) or ""), version


def _without_guard(text: str) -> str:  # the first switch: no prefill guard
    return "".join(line for line in text.splitlines(True) if "draft_prefill(batch" not in line)


def _clock_guard(text: str) -> str:  # the second: a guard without the request pool's count (its marker method)
    return text.replace("_sm120kit_live_requests", "_sm120kit_recent_decode")


@pytest.mark.parametrize("make_earlier", [_without_guard, _clock_guard], ids=["no-guard", "clock-guard"])
def test_a_tree_with_an_earlier_switch_is_refused_until_reverted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_earlier: Callable[[str], str]
) -> None:
    """A tree patched by a release of sm120check with an earlier switch: scan says so, patch refuses with the fix
    and changes nothing, and revert then patch gives the current switch."""
    tree = _copy(tmp_path, "0.5.16")
    current = plain_decode.add_switch

    def earlier(text: str, version: str) -> str:
        return make_earlier(current(text, version))

    with monkeypatch.context() as m:
        m.setattr(plain_decode, "add_switch", earlier)
        m.setattr(plain_decode, "applied", lambda text: "def _sm120kit_plain_decode(" in text)
        assert run_cli("patch", "--source", str(tree), "--plain-decode", *ARGS)[0] == 0
    assert plain_decode.earlier(_worker(tree)) and not plain_decode.applied(_worker(tree))
    earlier_edit_refused_until_reverted(tree, plain_decode.PATCH_ID, ARGS)
    assert plain_decode.applied(_worker(tree))


@pytest.mark.parametrize("version", ["0.5.14"])
def test_switch_refused_on_other_releases_with_nothing_changed(tmp_path: Path, version: str) -> None:
    tree = _copy(tmp_path, version)
    before = tree_hashes(tree)
    status, out = run_cli("patch", "--source", str(tree), "--plain-decode", *ARGS)
    assert status == 2
    assert "--plain-decode refused" in json.loads(out)["error"] and version in json.loads(out)["error"]
    assert tree_hashes(tree) == before
    scanned = json.loads(run_cli("scan", "--source", str(tree), *ARGS)[1])
    finding = next(f for f in scanned["findings"] if f["id"] == plain_decode.PATCH_ID)
    assert finding["ok"] and "not applied" in finding["summary"]  # not asked for: a note, never a fix


def test_switch_is_opt_in_a_plain_patch_leaves_the_worker_alone(tmp_path: Path) -> None:
    tree = _copy(tmp_path, "0.5.23")
    out = json.loads(run_cli("patch", "--source", str(tree), *ARGS)[1])
    assert plain_decode.PATH not in {f["path"] for f in out["files"]}
    assert not plain_decode.applied(_worker(tree))


def _functions(text: str) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef)}


def _params(fn: ast.FunctionDef) -> set[str]:
    return {a.arg for a in fn.args.args + fn.args.kwonlyargs}


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_sglang_name_the_switch_uses_exists_in_the_release(version: str) -> None:
    root = release_dir(version) / "sglang"

    def source(rel: str) -> str:
        return (root / rel).read_text(encoding="utf-8")

    cache_locs = _functions(source("kernels/ops/speculative/cache_locs.py"))["assign_extend_cache_locs_func"]
    assert {"req_pool_indices", "req_to_token", "start_offset", "end_offset", "batch_size", "draft_token_num"} <= (
        _params(cache_locs)
    )
    setup = _functions(source("srt/model_executor/model_runner_components/cuda_graph_setup.py"))
    assert "model_runner" in _params(setup["capture_decode_graph"])
    runner = source("srt/model_executor/model_runner.py")
    runner_fns = _functions(runner)
    assert {"sample", "forward", "_get_attention_backend"} <= set(runner_fns)
    assert "init_new_workspace" in _params(runner_fns["_get_attention_backend"])
    result = source("srt/managers/utils.py")
    fields = "logits_output next_token_ids can_run_cuda_graph speculative_num_draft_tokens accept_lens new_seq_lens"
    for name in fields.split():
        assert f"    {name}:" in result, name
    assert "extra_keep_alive_refs" in result and "next_draft_input" in result
    batch = source("srt/managers/schedule_batch.py")
    for name in ("orig_seq_lens", "seq_lens_cpu", "seq_lens_sum", "return_logprob", "spec_algorithm"):
        assert f"    {name}:" in batch, name
    assert "def from_string" in source("srt/speculative/spec_info.py")
    assert "def init_new" in source("srt/model_executor/forward_batch_info.py")
    worker = ast.parse(source(plain_decode.PATH))
    from sm120check.sglang.textedit import top_level_names

    assert set(plain_decode.NEEDED_NAMES) <= top_level_names(worker)


def test_counts_read_the_last_record_of_a_log() -> None:
    lines = [
        "[2026-12-06 04:10:00] Decode batch, #running-req: 30, accept len: 1.00, cuda graph: True",
        f'[2026-12-06 04:10:01] {plain_decode.LOG_PREFIX}{{"decode_batches": 200, "plain": {{"30": 150}}, '
        '"speculative": {"1": 50}}',
        f'[2026-12-06 04:10:05] {plain_decode.LOG_PREFIX}{{"decode_batches": 400, "plain": {{"30": 300, "64": 50}}, '
        '"speculative": {"1": 50}}',
        f"[2026-12-06 04:10:06] {plain_decode.LOG_PREFIX}not json",
    ]
    assert plain_decode.counts(lines) == {
        "decode_batches": 400,
        "plain": {30: 300, 64: 50},
        "speculative": {1: 50},
    }
    assert plain_decode.counts(lines[:1]) is None
    record = '{"decode_batches": 400, "plain": {"40": 9}, "speculative": {}, "draft_prefills_skipped": 3}'
    found = plain_decode.evidence([f"[x] {plain_decode.READY_PREFIX} (...)", plain_decode.LOG_PREFIX + record])
    assert found is not None and found.draft_prefills_skipped == 3 and "3 prefills skipped the draft" in found.note
    earlier = plain_decode.evidence(lines)  # an earlier switch's lines have no such count
    assert earlier is not None and earlier.draft_prefills_skipped == 0 and "skipped" not in earlier.note
    hostile = f'{plain_decode.LOG_PREFIX}{{"decode_batches": 1, "plain": {{"x": -1}}, "speculative": {{}}}}'
    assert plain_decode.counts([hostile]) is None


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_upstream_patch_file_is_the_switch_and_git_applies_it(tmp_path: Path, version: str) -> None:
    """docs/patches/sglang-VERSION-plain-decode.patch: what the patcher adds, accepted by `git apply` on the release."""
    committed = Path(__file__).resolve().parents[2] / "docs" / "patches" / f"sglang-{version}-plain-decode.patch"
    original = _worker(release_dir(version) / "sglang")
    patched = plain_decode.add_switch(original, version)
    assert committed.read_text(encoding="utf-8") == upstream_diff(original, patched, plain_decode.PATH)
    tree = _copy(tmp_path, version)
    run = git_apply(committed, tree)
    assert run.returncode == 0, run.stderr
    assert _worker(tree) == plain_decode.add_switch(original, version)


SWITCH_LOG = Path(__file__).resolve().parent / "fixtures" / "h100-switch-0.5.16.log"


def _verify(log: Path, *extra: str) -> tuple[int, dict[str, object]]:
    status, out = run_cli("verify-launch", "--log", str(log), "--expect", "cuda-graph", "--json", *extra)
    return status, json.loads(out)


def test_verify_launch_holds_the_real_servers_batches_against_its_threshold() -> None:
    status, report = _verify(SWITCH_LOG, "--plain-decode-min-bs", "30")
    data = report["data"]
    assert isinstance(data, dict)
    switch = data["plain_decode"]
    assert isinstance(switch, dict) and switch["ready"] is True and switch["decode_batches"] == 8000
    assert report["problems"] == [] and status == 0
    assert "decode batches ran plain at batch sizes 30-100" in str(report["notes"])


def test_verify_launch_names_batches_on_the_wrong_side_of_the_threshold() -> None:
    status, report = _verify(SWITCH_LOG, "--plain-decode-min-bs", "10")
    assert status == 1
    problems = report["problems"]
    assert isinstance(problems, list) and len(problems) == 1
    assert "speculative ones of [16] at or above it" in problems[0]


def test_verify_launch_fails_a_threshold_the_server_never_had(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("".join(line for line in SWITCH_LOG.read_text().splitlines(True) if "sm120kit" not in line))
    status, report = _verify(log, "--plain-decode-min-bs", "30")
    assert status == 1
    assert "never logged `sm120kit plain decode: ready`" in str(report["problems"])
    assert "sglang patch --plain-decode" in str(report["problems"])
    status, report = _verify(log)  # no threshold asked: the absent switch is no problem
    assert status == 0 and report["data"]["plain_decode"] is None  # type: ignore[index]
