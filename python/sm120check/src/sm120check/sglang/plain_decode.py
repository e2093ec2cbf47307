"""The speculation switch (`sglang patch --plain-decode`): a 0-step decode batch of SGLang's EAGLE worker (spec v2)
runs the target's plain decode instead of SGLang's one-token verify.

SGLang's own 0-step slot (`_build_trivial_verify_input`) still runs the target in TARGET_VERIFY mode through the
verify graphs, the custom-mask attention path and the speculative accept kernel. The switch adds three methods to
`EAGLEWorkerV2` in `srt/speculative/eagle_worker_v2.py` and two calls:
- `init_cuda_graphs` ends by building a second target attention backend and capturing the target's decode CUDA graphs
  (one token per request) with the model runner seen as non-speculative, as a plain server captures them;
- `forward_batch_generation`, before the 0-step branch, runs a decode batch as a plain decode when its adaptive slot
  says 0 steps, or, with `SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS=N` in the server's environment, when it has N or more
  requests (a static server, no adaptive mode). ForwardMode.DECODE, those graphs, the model runner's sampler; the
  result is SGLang's one-token spec-v2 result, so the scheduler commits it as it commits a 0-step verify. The draft
  is skipped and its next input stubbed (as `SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND` does); the draft's first round
  after the batch shrinks drafts from that stub and is rejected, the next rounds draft from the target's tokens.
- Batches that ask for logprobs, a grammar or hidden states keep SGLang's 0-step path.
- With the threshold set, a prefill skips the draft's extend when the batch it joins will decode plain: the
  requests holding a slot of the shared request pool (the running ones, this prefill's, a chunked one) reach the
  threshold. Every rank's scheduler allocates those slots alike, so under tensor parallelism every rank decides alike
  (the draft's extend runs collectives). The guard sits before the `with` block that calls
  `_draft_extend_for_prefill`; the prefill's next draft input is stubbed as the plain decode's is. The draft's KV
  cache then lacks those prompts, as it lacks the tokens decoded plain: a request that later speculates drafts from
  the target's tokens with that gap (the outputs are the target's either way). Adaptive servers (0-step slots, no
  threshold) keep the draft's prefill.
- Rank 0 logs `sm120kit plain decode batches: {json}` every LOG_EVERY decode batches: cumulative counts of plain and
  speculative decode batches per batch size and of the prefills that skipped the draft (`verify-launch` and the GPU
  tests read them).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass

from sm120check.sglang.errors import SglangError
from sm120check.sglang.textedit import MARK, Source, replace, top_level_names

PATCH_ID = "plain-decode"
PATH = "srt/speculative/eagle_worker_v2.py"
WORKER = "EAGLEWorkerV2"
# The releases whose EAGLE worker the switch was written against, read from their wheels' sources.
SUPPORTED = ("0.5.16", "0.5.23")
ENV_MIN_BS = "SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS"
LOG_PREFIX = "sm120kit plain decode batches: "
READY_PREFIX = "sm120kit plain decode: ready"
LOG_EVERY = 200
MAX_RECORD_CHARS = 1 << 16  # a count line of the patch's is a few hundred characters; a longer one is not its
_CALL_WANTED = "self._sm120kit_plain_decode_wanted(batch)"
_CALL_PREFILL = "self._sm120kit_skip_draft_prefill(batch)"
_INIT_CALL = "self._sm120kit_plain_decode_init()"
_MARK_CURRENT = "def _sm120kit_live_requests("  # the method only the current version of the switch has
# Module-level names the added methods use, bound by the worker module of both releases
NEEDED_NAMES = ("GenerationBatchResult", "EagleDraftInput", "log_info_on_rank0", "logger", "torch")

_METHODS = f'''\
def _sm120kit_plain_decode_init(self):
    """Capture the target's plain decode CUDA graphs (one token a request) on an attention backend of their own."""
    import os

    from sglang.srt.model_executor.model_runner_components.cuda_graph_setup import capture_decode_graph
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    raw = os.environ.get("{ENV_MIN_BS}", "").strip()
    if raw and not (raw.isdigit() and int(raw) >= 1):
        raise ValueError(f"{ENV_MIN_BS}={{raw!r}}: expected a batch size of 1 or more (or unset)")
    self._sm120kit_plain_min_bs = int(raw) if raw else None
    self._sm120kit_counts = {{"plain": {{}}, "speculative": {{}}, "draft_prefills_skipped": 0}}
    self._sm120kit_decode_batches = 0
    mr = self._target_worker.model_runner
    saved = (mr.spec_algorithm, mr.attn_backend, mr.decode_cuda_graph_runner, mr.init_new_workspace)
    mr.spec_algorithm = SpeculativeAlgorithm.from_string(None)
    try:
        mr.attn_backend = mr._get_attention_backend(init_new_workspace=True)
        capture = capture_decode_graph(model_runner=mr)
        self._sm120kit_plain = (mr.attn_backend, capture.runner)
    finally:
        mr.spec_algorithm, mr.attn_backend, mr.decode_cuda_graph_runner, mr.init_new_workspace = saved
    log_info_on_rank0(
        logger,
        f"{READY_PREFIX} (decode CUDA graphs: {{capture.runner is not None}}, "
        f"adaptive 0-step slots: {{self.adaptive_controller is not None}}, "
        f"from batch size: {{self._sm120kit_plain_min_bs}})",
    )

def _sm120kit_plain_decode_wanted(self, batch):
    """Whether this decode batch runs as a plain decode; counts every decode batch by size."""
    if getattr(self, "_sm120kit_plain", None) is None or batch.forward_mode.is_idle():
        return False
    bs = batch.seq_lens.shape[0]
    plain = (
        batch.spec_info is not None
        and not batch.spec_info.is_verify_input()
        and not batch.return_logprob
        and not batch.has_grammar
        and not getattr(batch, "return_hidden_states", False)
        and (
            self.speculative_num_steps == 0
            or (self._sm120kit_plain_min_bs is not None and bs >= self._sm120kit_plain_min_bs)
        )
    )
    counts = self._sm120kit_counts["plain" if plain else "speculative"]
    counts[bs] = counts.get(bs, 0) + 1
    self._sm120kit_decode_batches += 1
    if self._sm120kit_decode_batches % {LOG_EVERY} == 0:
        import json

        log_info_on_rank0(
            logger,
            "{LOG_PREFIX}"
            + json.dumps({{"decode_batches": self._sm120kit_decode_batches, **self._sm120kit_counts}}),
        )
    return plain

def _sm120kit_skip_draft_prefill(self, batch):
    """Whether this prefill skips the draft's extend: the batch it joins reaches the plain threshold."""
    min_bs = getattr(self, "_sm120kit_plain_min_bs", None)
    if getattr(self, "_sm120kit_plain", None) is None or min_bs is None or batch.forward_mode.is_idle():
        return False
    if self.server_args.enable_dp_attention:
        return False
    return self._sm120kit_live_requests() >= min_bs

def _sm120kit_live_requests(self):
    """Requests holding a slot of the request pool the scheduler shares: running, being prefilled, chunked."""
    pool = self.req_to_token_pool
    return pool.size - pool.available_size()

def _sm120kit_stub_draft_prefill(self, batch, batch_output):
    """The prefill's result without the draft's extend: its next draft input stubbed as a plain decode's."""
    batch_output.next_draft_input = EagleDraftInput(
        bonus_tokens=batch_output.next_token_ids, num_tokens_per_req=1, num_tokens_for_logprob_per_req=1
    )
    self._stub_skipped_draft_extend(batch, batch_output)
    self._sm120kit_counts["draft_prefills_skipped"] += 1
    return batch_output

def _sm120kit_plain_decode(self, batch, on_publish):
    """One plain decode step of the target: ForwardMode.DECODE, its decode graphs, the sampler; the draft stubbed."""
    from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    mr = self._target_worker.model_runner
    attn_backend, graph_runner = self._sm120kit_plain
    bs = batch.seq_lens.shape[0]
    seq_lens = batch.seq_lens  # spec v2: the length before this step's token
    draft_input = batch.spec_info
    batch.input_ids = draft_input.bonus_tokens
    batch.out_cache_loc = assign_extend_cache_locs_func(
        req_pool_indices=batch.req_pool_indices,
        req_to_token=self.req_to_token_pool.req_to_token,
        start_offset=seq_lens,
        end_offset=seq_lens + 1,
        batch_size=bs,
        draft_token_num=1,
        device=self.device,
    )
    saved_batch = (
        batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum, batch.orig_seq_lens,
        batch.spec_info, batch.spec_algorithm, batch.forward_mode,
    )
    saved_mr = (mr.spec_algorithm, mr.attn_backend, mr.decode_cuda_graph_runner)
    plain_algorithm = SpeculativeAlgorithm.from_string(None)
    batch.seq_lens = seq_lens + 1  # a plain decode's lengths include the token it feeds
    if batch.seq_lens_cpu is not None:
        batch.seq_lens_cpu = batch.seq_lens_cpu + 1
    if batch.seq_lens_sum is not None:
        batch.seq_lens_sum = batch.seq_lens_sum + bs
    if batch.orig_seq_lens is not None:
        batch.orig_seq_lens = batch.orig_seq_lens + 1
    batch.spec_info, batch.spec_algorithm, batch.forward_mode = None, plain_algorithm, ForwardMode.DECODE
    mr.spec_algorithm, mr.attn_backend, mr.decode_cuda_graph_runner = plain_algorithm, attn_backend, graph_runner
    try:
        forward_batch = ForwardBatch.init_new(batch, mr, return_hidden_states_before_norm=False)
        output = mr.forward(forward_batch)
        next_token_ids = mr.sample(output.logits_output, forward_batch).to(torch.int32)
    finally:
        mr.spec_algorithm, mr.attn_backend, mr.decode_cuda_graph_runner = saved_mr
        (
            batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum, batch.orig_seq_lens,
            batch.spec_info, batch.spec_algorithm, batch.forward_mode,
        ) = saved_batch
    result = GenerationBatchResult(
        logits_output=output.logits_output,
        next_token_ids=next_token_ids,
        can_run_cuda_graph=output.can_run_graph,
        speculative_num_draft_tokens=1,
        next_draft_input=EagleDraftInput(bonus_tokens=next_token_ids),
        accept_lens=torch.ones(bs, dtype=torch.int32, device=self.device),
        new_seq_lens=seq_lens + 1,
        extra_keep_alive_refs=[forward_batch],
    )
    if on_publish is not None:
        on_publish(result.new_seq_lens)
    self._stub_skipped_draft_extend(batch, result)
    return result
'''


@dataclass(frozen=True)
class SwitchScan:
    """What the scan knows of one opt-in edit (the switch, or spec_stream's) in one tree."""

    path: str
    supported: bool  # a release the switch was written against
    applied: bool
    reason: str  # why it cannot be applied (empty when it can)


def _worker(module: ast.Module) -> ast.ClassDef | None:
    return next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == WORKER), None)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _calls_trivial(node: ast.stmt) -> bool:
    return any(
        isinstance(n, ast.Attribute) and n.attr == "_build_trivial_verify_input" and isinstance(n.value, ast.Name)
        for n in ast.walk(node)
    )


def _draft_prefill(cls: ast.ClassDef) -> ast.With | None:
    """The one `with` block of the prefill path that calls the draft's `_draft_extend_for_prefill`."""
    found = [
        node
        for name in ("forward_batch_generation", "_forward_prefill_batch")
        if (fn := _method(cls, name)) is not None
        for node in ast.walk(fn)
        if isinstance(node, ast.With)
        and any(isinstance(n, ast.Attribute) and n.attr == "_draft_extend_for_prefill" for n in ast.walk(node))
    ]
    return found[0] if len(found) == 1 else None


def _zero_step_branch(fn: ast.FunctionDef) -> ast.If | None:
    """The statement of the decode branch that holds SGLang's 0-step path (an `if`, or the `if` of its elif chain)."""
    for node in ast.walk(fn):
        if isinstance(node, ast.If) and node.orelse and _calls_trivial(node):
            for stmt in node.orelse:  # the decode branch is the else of `if batch.forward_mode.is_extend() ...`
                if isinstance(stmt, ast.If) and _calls_trivial(stmt):
                    return stmt
    return None


def applied(text: str) -> bool:
    return all(s in text for s in (_CALL_WANTED, _INIT_CALL, _CALL_PREFILL, _MARK_CURRENT))


def earlier(text: str) -> bool:
    """An earlier version of the switch is in the worker: plain decode without the prefill guard, or with the guard
    that read the last decode batch's size and time in place of the request pool."""
    return not applied(text) and "_sm120kit_plain_decode" in text


EARLIER = (
    "an earlier version of the speculation switch is in this tree (without the draft-prefill guard, or with one "
    "that judged the batch by the last decode batch and a clock); "
    "run `sm120check sglang patch --revert`, then patch again with --plain-decode"
)


def survey(text: str | None, version: str) -> SwitchScan:
    if text is None:
        return SwitchScan(PATH, False, False, f"{PATH} not found (no EAGLE spec-v2 worker in this release)")
    if applied(text):
        return SwitchScan(PATH, True, True, "")
    if earlier(text):
        return SwitchScan(PATH, True, False, EARLIER)
    if version not in SUPPORTED:
        why = f"SGLang {version} is not a release the switch was written against ({', '.join(SUPPORTED)})"
        return SwitchScan(PATH, False, False, why)
    try:
        _plan(text)
    except SglangError as exc:
        return SwitchScan(PATH, True, False, str(exc))
    return SwitchScan(PATH, True, False, "")


def _plan(text: str) -> list[tuple[int, str]]:
    """(offset, text) insertions, or SglangError naming the anchor that is missing."""
    module = ast.parse(text)
    cls = _worker(module)
    if cls is None:
        raise SglangError(f"{PATH}: class {WORKER} not found; the switch does not apply to this tree")
    forward = _method(cls, "forward_batch_generation")
    init = _method(cls, "init_cuda_graphs")
    stub = _method(cls, "_stub_skipped_draft_extend")
    if forward is None or init is None or stub is None:
        missing = [n for n, f in (("forward_batch_generation", forward), ("init_cuda_graphs", init)) if f is None]
        missing += ["_stub_skipped_draft_extend"] if stub is None else []
        raise SglangError(f"{PATH}: {WORKER} lacks {', '.join(missing)}; the switch does not apply to this tree")
    branch = _zero_step_branch(forward)
    if branch is None:
        raise SglangError(f"{PATH}: {WORKER}.forward_batch_generation has no 0-step branch to switch")
    prefill = _draft_prefill(cls)
    if prefill is None:
        raise SglangError(f"{PATH}: {WORKER} has no single draft-prefill block (_draft_extend_for_prefill) to guard")
    missing = [n for n in NEEDED_NAMES if n not in top_level_names(module)]
    if missing:
        raise SglangError(f"{PATH}: the module does not bind {', '.join(missing)}; the switch does not apply to it")
    src = Source(text)
    nl = src.newline()
    indent = src.indent_of(branch.lineno)
    step = indent + " " * 4
    guard = (
        f"{indent}if {_CALL_WANTED}:  {MARK}: the target's plain decode at 0 draft steps{nl}"
        f"{step}return self._sm120kit_plain_decode(batch, on_publish)  {MARK}{nl}"
    )
    prefill_indent = src.indent_of(prefill.lineno)
    prefill_guard = (
        f"{prefill_indent}if {_CALL_PREFILL}:  {MARK}: the batch it joins decodes plain{nl}"
        f"{prefill_indent}    return self._sm120kit_stub_draft_prefill(batch, batch_output)  {MARK}{nl}"
    )
    last = init.body[-1]
    init_indent = src.indent_of(last.lineno)
    init_call = f"{init_indent}{_INIT_CALL}  {MARK}: capture the plain decode graphs{nl}"
    method_indent = src.indent_of(cls.body[0].lineno)
    lines = [f"{MARK}: the speculation switch (sm120check sglang patch --plain-decode)", *_METHODS.splitlines()]
    block = nl + "".join(f"{method_indent}{line}  {MARK}{nl}" if line.strip() else nl for line in lines)
    return [
        (src.line_start(prefill.lineno), prefill_guard),
        (src.line_start(branch.lineno), guard),
        (src.after_line(last.end_lineno or last.lineno), init_call),
        (src.after_line(cls.end_lineno or cls.lineno), block),
    ]


def add_switch(text: str, version: str) -> str:
    """The worker's source with the switch (unchanged when it is there already); SglangError when it cannot apply."""
    if applied(text):
        return text
    if earlier(text):
        raise SglangError(f"{PATH}: {EARLIER}")
    if version not in SUPPORTED:
        raise SglangError(
            f"SGLang {version}: the plain-decode switch is written for {', '.join(SUPPORTED)} only; "
            "patch without --plain-decode, or install one of those releases"
        )
    for offset, insert in sorted(_plan(text), reverse=True):
        text = replace(text, offset, offset, insert)
    return text


def counts(lines: list[str]) -> dict[str, object] | None:
    """The last `sm120kit plain decode batches:` record of a server log, strictly read (None: no such line)."""
    for line in reversed(lines):
        at = line.find(LOG_PREFIX)
        if at < 0 or len(line) > MAX_RECORD_CHARS:
            continue
        try:
            raw = json.loads(line[at + len(LOG_PREFIX) :].strip())
        except (ValueError, RecursionError):  # not the patch's line: a hand-made or cut one
            continue
        if not isinstance(raw, dict) or not isinstance(raw.get("decode_batches"), int):
            continue
        out: dict[str, object] = {"decode_batches": raw["decode_batches"]}
        if "draft_prefills_skipped" in raw:  # absent in an earlier switch's records
            skipped = raw["draft_prefills_skipped"]
            if not isinstance(skipped, int) or isinstance(skipped, bool) or skipped < 0:
                continue
            out["draft_prefills_skipped"] = skipped
        for kind in ("plain", "speculative"):
            table = raw.get(kind)
            if not isinstance(table, dict) or not all(
                isinstance(k, str) and k.isdigit() and isinstance(v, int) and v >= 0 for k, v in table.items()
            ):
                break
            out[kind] = {int(k): v for k, v in table.items()}
        else:
            return out
    return None


@dataclass(frozen=True)
class SwitchEvidence:
    """What a server log says of the switch: whether it was ready, and the decode batches by kind and size."""

    ready: bool
    decode_batches: int
    plain: dict[int, int]
    speculative: dict[int, int]
    draft_prefills_skipped: int = 0

    @property
    def note(self) -> str:
        if not self.ready:
            return "speculation switch: not in this server (no `sm120kit plain decode: ready` line)"
        if not self.decode_batches:
            return f"speculation switch: ready; fewer than {LOG_EVERY} decode batches logged so far"
        share = sum(self.plain.values()) / self.decode_batches
        where = f" at batch sizes {min(self.plain)}-{max(self.plain)}" if self.plain else ""
        spec = f"; speculative at {min(self.speculative)}-{max(self.speculative)}" if self.speculative else ""
        skipped = f"; {self.draft_prefills_skipped} prefills skipped the draft" if self.draft_prefills_skipped else ""
        return (
            f"speculation switch: {share:.0%} of {self.decode_batches} decode batches ran plain{where}{spec}{skipped}"
        )

    def against(self, min_bs: int) -> str:
        """What contradicts a launch whose threshold is `min_bs` ("" when nothing does)."""
        if not self.ready:
            return (
                f"speculation switch: the launch asks for plain decode from batch {min_bs}, and this server never "
                "logged `sm120kit plain decode: ready`. Fix: sm120check sglang patch --plain-decode (role variable "
                "sglang_sm120_plain_decode: true), then restart the server"
            )
        early = sorted(b for b in self.plain if b < min_bs)
        late = sorted(b for b in self.speculative if b >= min_bs)
        if early or late:
            return (
                f"speculation switch: asked for plain decode from batch {min_bs}, the server ran plain batches of "
                f"{early or 'none'} below it and speculative ones of {late or 'none'} at or above it. Fix: check "
                "SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS in the unit's environment (sglang_server_plain_decode_min_bs)"
            )
        return ""

    def to_dict(self) -> dict[str, object]:
        return {
            "ready": self.ready,
            "decode_batches": self.decode_batches,
            "plain": {str(k): v for k, v in sorted(self.plain.items())},
            "speculative": {str(k): v for k, v in sorted(self.speculative.items())},
            "draft_prefills_skipped": self.draft_prefills_skipped,
        }


def evidence(lines: list[str]) -> SwitchEvidence | None:
    """The switch's evidence in a server log (None: the log never mentions it)."""
    ready = any(READY_PREFIX in line for line in lines)
    found = counts(lines)
    if not ready and found is None:
        return None
    if found is None:
        return SwitchEvidence(ready, 0, {}, {})
    plain, spec, skipped = found["plain"], found["speculative"], found.get("draft_prefills_skipped", 0)
    assert isinstance(plain, dict) and isinstance(spec, dict) and isinstance(found["decode_batches"], int)
    assert isinstance(skipped, int)
    return SwitchEvidence(ready, found["decode_batches"], dict(plain), dict(spec), skipped)
