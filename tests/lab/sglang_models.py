"""A Llama TARGET and its EAGLE-3 DRAFT, HF-format, for a real SGLang 0.5.16 server: speculation pays by construction.

No weights can be downloaded, so the tests write them. `python tests/lab/sglang_models.py write --out DIR` writes
DIR/target (LlamaForCausalLM) and DIR/draft (LlamaForCausalLMEagle3), each with config.json, *.safetensors (sharded
with model.safetensors.index.json when large), generation_config.json and a real `tokenizers` tokenizer.

Vocabulary (V ids): 0 <unk>, 1 <s> (bos), 2 </s> (eos), then the words "w0".."w{n-1}" (id 3 + k is "w{k}"), then 188
character pieces ("c", "##c" for printable ASCII) in the last ids where V allows (`char_pieces`); WordPiece model (a
word not in the vocabulary is spelled in character pieces, so no two different prompts tokenize alike), whitespace
pre-tokenizer, decoded joined by spaces. The chat template is bos then the messages' contents.

The construction (E: V x H Gaussian rows scaled to RMS exactly 1, so RMSNorm(e_i) = e_i with norm weights 1):
- A token map f: one cycle over the regular ids (a seeded permutation); each special id maps to a distinct regular id,
  so the models never emit a special token (a bench gets its full output length without ignore_eos).
- TARGET: every layer's o_proj and down_proj are zero, so the residual stream equals e_{x_t} at every layer, while
  q/k/v/gate/up (std 0.02) cost the compute of a real model. lm_head row j = sum of E[i] over i with f(i) = j, so the
  logit of f(x_t) is ~H and the others ~sqrt(H) noise: greedy next token = f(current token), from any prompt.
- DRAFT: aux input [e; e; e]; fc = [I/3, I/3, I/3] gives e_{x_t}; midlayer o_proj zero (the qkv over 2H still costs its
  compute); the MLP (intermediate size V) is a lookup: neuron j has gate row alpha E[j] / H, up row E[j] / H and
  down column (E[f(j)] - E[j]) / silu(alpha), so for an input e_i only neuron i fires (~1; the other V - 1 add noise
  of norm ~sqrt(1.5 V / H) against |e| = sqrt(H)) and the residual after the layer is e_{f(x_t)}. The draft's own
  lm_head (the target's rows, permuted by sigma, see below) then predicts f(f(x_t)), and the next draft step, fed the
  draft's own pre-norm output (width H, fc skipped), continues the chain.
- `--draft-error P`: sigma is one cycle over a seeded random set S of round(P * N) regular ids (N = V - 3; a set of
  one is grown to two), and the draft's lm_head row sigma(k) is the target's row k. The draft's *state* stays right
  (the MLP chain does not go through the head), so its k-th proposal in a round is sigma(x_{p+k}): right iff
  x_{p+k} is not in S. With n = --speculative-num-steps draft tokens a round (topk 1), the accept length (tokens per
  verify, bonus included, SGLang's `accept length`) is A = 1 + sum_{k=1..n} prod_{i=1..k} [x_{p+i} not in S], whose
  mean is sum_{k=0..n} (1 - P)^k = (1 - (1 - P)^{n+1}) / P (4 at P = 0, 3.44 at 0.1, 2.53 at 0.3, 1.88 at 0.5 for
  n = 3); exactly, prod_{i<k} (N - m - i) / (N - i) for m = |S| in place of (1 - P)^k (the k tokens are distinct).

Verified against SGLang 0.5.16's source (the wheel, sglang/srt/...):
- models/llama.py LlamaModel.forward: before layer i in `layers_to_capture` it appends `hidden_states + residual`
  (the residual stream after layer i-1; here e_{x_t}); LlamaDecoderLayer.forward: input_layernorm fused with the
  residual add, post_attention_layernorm likewise, the MLP output is added by the next layer's norm / the final
  `self.norm(hidden_states, residual)`. LlamaForCausalLM.set_eagle3_layers_to_capture: default [2, L//2, L-3], with
  layer ids from the draft's eagle_config "eagle_aux_hidden_state_layer_ids" it captures [id + 1 for id in ids]
  (a layer is appended once however often it is named, so the three must be distinct and id + 1 <= L - 1). We write
  the ids explicitly: [1, L//2 - 1, L - 4] (the default's capture points) for L >= 7, [0, 1, 2] for L in 4..6.
  load_weights: stacked q/k/v -> qkv_proj, gate/up -> gate_up_proj; lm_head.weight is loaded (tie_word_embeddings
  false). model_executor/model_runner_components/spec_aux_hidden_state.py reads the draft's eagle_config.
- layers/layernorm.py RMSNorm.forward_native: fp32 (x + residual), residual kept in the model dtype, x * rsqrt(mean
  x^2 + eps) * weight, cast back. layers/logits_processor.py: aux hidden states are torch.cat(..., dim=-1) in layer
  order (3H for the target, H for the draft's own output).
- models/llama_eagle3.py LlamaModel.__init__: fc is Linear(target_hidden_size * num_aux, hidden) (num_aux from
  eagle_config's layer ids, else 3), no fc_norm unless `fc_norm`/`use_aux_norm`; forward: fc applied only when the
  incoming hidden width differs from the embedding width (so the draft's own H-wide output skips it); the input layer
  (LlamaDecoderLayer.forward, layer 0): residual = hidden (fc output), qkv over cat(input_layernorm(embeds),
  hidden_norm(hidden)), then post_attention_layernorm(attn, residual), mlp; final `self.norm(hidden, residual)`
  returns (to_logits, to_aux) and the aux handed on is the pre-norm sum (norm_output false). LlamaForCausalLMEagle3:
  with draft_vocab_size set (here = vocab_size) load_lm_head_from_target is False and its own lm_head (draft_vocab_size
  rows) is loaded; load_weights maps legacy "midlayer" -> "layers.0", prefixes "model." when needed, reads d2t
  (hot_token_id) and skips t2d; we write no d2t/t2d (no hot-token remap, so the fast topk-1 chain path is used).
- speculative/eagle_worker_v2.py init_lm_head: for EAGLE3 without load_lm_head_from_target only `set_embed(embed)`
  replaces the draft's embedding by the target's (ours are equal anyway, and the embedding only feeds the attention,
  whose o_proj is zero); the draft's lm_head stays its own, so the error can live in the head.
  _draft_extend_for_prefill / _draft_extend_for_decode: the draft extend gets input ids shifted by one (x_{t+1})
  with the target's aux hidden at t; its last position's top-1 is the first proposal and its hidden is carried;
  draft_forward: num_steps proposals, the first from the extend, then num_steps - 1 draft forwards each fed the
  previous forward's hidden_states (the draft's aux).

Not run here: the SGLang server itself (this module only writes files and checks them with a torch reference forward,
`reference_*` below, that mirrors those functions).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
N_SPECIAL = len(SPECIAL_TOKENS)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if not loop.first %}{{ ' ' }}{% endif %}"
    "{{ message['content'] }}{% endfor %}"
)
SHARD_BYTES = 4 * 1024**3
WEIGHT_STD = 0.02
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class ModelSpec:
    """The shapes and knobs of one TARGET/DRAFT pair."""

    layers: int = 32
    hidden: int = 4096
    intermediate: int = 11008
    vocab: int = 32000
    heads: int = 32
    kv_heads: int = 8
    seed: int = 0
    draft_error: float = 0.0
    dtype: str = "bfloat16"
    alpha: float = 20.0
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096

    def __post_init__(self) -> None:
        if self.layers < 4:
            raise ValueError("layers must be >= 4: EAGLE-3 captures three distinct layers before layers 1..L-1")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError("hidden must be a multiple of heads, heads a multiple of kv_heads")
        if (self.hidden // self.heads) % 2:
            raise ValueError("head_dim must be even (RoPE)")
        if self.vocab < N_SPECIAL + 2:
            raise ValueError(f"vocab must be >= {N_SPECIAL + 2}")
        if not 0.0 <= self.draft_error <= 1.0:
            raise ValueError("draft_error must be in [0, 1]")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def regular(self) -> int:
        return self.vocab - N_SPECIAL

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def aux_layer_ids(self) -> list[int]:
        """Layer ids for the draft's eagle_config: SGLang captures the stream before layer id + 1."""
        if self.layers >= 7:
            return [1, self.layers // 2 - 1, self.layers - 4]
        return [0, 1, 2]


# ------------------------------------------------------------------------------------------------- the maps


@dataclass(frozen=True)
class TokenMaps:
    """f (the target's next token for every id) and sigma (the draft head's permutation: identity outside S)."""

    f: list[int]
    sigma: list[int]
    error_set: frozenset[int] = field(default_factory=frozenset)

    def draft_next(self, state: int) -> int:
        """The draft's proposal when its state is token `state`: sigma(f(state))."""
        return self.sigma[self.f[state]]


def token_maps(spec: ModelSpec) -> TokenMaps:
    g = torch.Generator().manual_seed(spec.seed * 1000003 + 17)
    order = (torch.randperm(spec.regular, generator=g) + N_SPECIAL).tolist()
    f = [0] * spec.vocab
    for k, tok in enumerate(order):
        f[tok] = order[(k + 1) % len(order)]
    targets = order[:N_SPECIAL]  # distinct regular ids the specials map to
    for s in range(N_SPECIAL):
        f[s] = targets[s % len(targets)]
    m = round(spec.draft_error * spec.regular)
    if m == 1:
        m = 2
    g2 = torch.Generator().manual_seed(spec.seed * 1000003 + 29)
    chosen = (torch.randperm(spec.regular, generator=g2)[:m] + N_SPECIAL).tolist()
    sigma = list(range(spec.vocab))
    for k, tok in enumerate(chosen):
        sigma[tok] = chosen[(k + 1) % m]
    return TokenMaps(f=f, sigma=sigma, error_set=frozenset(chosen))


def expected_accept_length(p: float, num_steps: int) -> float:
    """Mean tokens per verify round (bonus included) for a draft wrong on a fraction p of states, topk 1."""
    return sum((1.0 - p) ** k for k in range(num_steps + 1))


def exact_accept_length(regular: int, errors: int, num_steps: int) -> float:
    """The same, the k distinct upcoming tokens drawn without replacement from `regular` ids of which `errors` err."""
    total, run = 1.0, 1.0
    for i in range(num_steps):
        run *= max(regular - errors - i, 0) / (regular - i)
        total += run
    return total


# ------------------------------------------------------------------------------------------------- the tensors

TensorFn = Callable[[], torch.Tensor]


class _Weights:
    """Seeded tensors on one device: generated in a fixed order, so a plan replays identically."""

    def __init__(self, spec: ModelSpec, device: str) -> None:
        self.spec = spec
        self.device = torch.device(device)
        self.maps = token_maps(spec)
        self.gen = torch.Generator(device=self.device).manual_seed(spec.seed)
        self._embed: torch.Tensor | None = None

    def randn(self, *shape: int, std: float) -> torch.Tensor:
        t = torch.randn(*shape, generator=self.gen, device=self.device, dtype=torch.float32)
        return (t * std).to(self.spec.torch_dtype)

    def zeros(self, *shape: int) -> torch.Tensor:
        return torch.zeros(*shape, device=self.device, dtype=self.spec.torch_dtype)

    def ones(self, n: int) -> torch.Tensor:
        return torch.ones(n, device=self.device, dtype=self.spec.torch_dtype)

    def embed32(self) -> torch.Tensor:
        """E in float32, rows with RMS exactly 1 (before the cast to the model dtype)."""
        if self._embed is None:
            g = torch.Generator(device=self.device).manual_seed(self.spec.seed * 7919 + 1)
            e = torch.randn(self.spec.vocab, self.spec.hidden, generator=g, device=self.device, dtype=torch.float32)
            self._embed = e / e.pow(2).mean(dim=1, keepdim=True).sqrt()
        return self._embed

    def embed(self) -> torch.Tensor:
        return self.embed32().to(self.spec.torch_dtype)

    def _f(self) -> torch.Tensor:
        return torch.tensor(self.maps.f, device=self.device, dtype=torch.long)

    def target_head32(self) -> torch.Tensor:
        """Row j = sum of E[i] over i with f(i) = j."""
        head = torch.zeros_like(self.embed32())
        head.index_add_(0, self._f(), self.embed32())
        return head

    def target_head(self) -> torch.Tensor:
        return self.target_head32().to(self.spec.torch_dtype)

    def draft_head(self) -> torch.Tensor:
        """Row sigma(k) = the target's row k."""
        sigma = torch.tensor(self.maps.sigma, device=self.device, dtype=torch.long)
        head = torch.empty_like(self.target_head32())
        head[sigma] = self.target_head32()
        return head.to(self.spec.torch_dtype)

    def draft_fc(self) -> torch.Tensor:
        eye = torch.eye(self.spec.hidden, device=self.device, dtype=torch.float32) / 3.0
        return torch.cat([eye, eye, eye], dim=1).to(self.spec.torch_dtype)

    def draft_gate(self) -> torch.Tensor:
        return (self.embed32() * (self.spec.alpha / self.spec.hidden)).to(self.spec.torch_dtype)

    def draft_up(self) -> torch.Tensor:
        return (self.embed32() / self.spec.hidden).to(self.spec.torch_dtype)

    def draft_down(self) -> torch.Tensor:
        e = self.embed32()
        scale = float(torch.nn.functional.silu(torch.tensor(self.spec.alpha)))
        return ((e[self._f()] - e) / scale).T.contiguous().to(self.spec.torch_dtype)


def _attn_plan(w: _Weights, prefix: str, in_dim: int) -> list[tuple[str, tuple[int, ...], TensorFn]]:
    s = w.spec
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return [
        (f"{prefix}.self_attn.q_proj.weight", (q, in_dim), lambda: w.randn(q, in_dim, std=WEIGHT_STD)),
        (f"{prefix}.self_attn.k_proj.weight", (kv, in_dim), lambda: w.randn(kv, in_dim, std=WEIGHT_STD)),
        (f"{prefix}.self_attn.v_proj.weight", (kv, in_dim), lambda: w.randn(kv, in_dim, std=WEIGHT_STD)),
        (f"{prefix}.self_attn.o_proj.weight", (s.hidden, q), lambda: w.zeros(s.hidden, q)),
    ]


def target_plan(w: _Weights) -> list[tuple[str, tuple[int, ...], TensorFn]]:
    s = w.spec
    h, i = s.hidden, s.intermediate
    plan: list[tuple[str, tuple[int, ...], TensorFn]] = [("model.embed_tokens.weight", (s.vocab, h), w.embed)]
    for layer in range(s.layers):
        p = f"model.layers.{layer}"
        plan.append((f"{p}.input_layernorm.weight", (h,), lambda: w.ones(h)))
        plan += _attn_plan(w, p, h)
        plan += [
            (f"{p}.post_attention_layernorm.weight", (h,), lambda: w.ones(h)),
            (f"{p}.mlp.gate_proj.weight", (i, h), lambda: w.randn(i, h, std=WEIGHT_STD)),
            (f"{p}.mlp.up_proj.weight", (i, h), lambda: w.randn(i, h, std=WEIGHT_STD)),
            (f"{p}.mlp.down_proj.weight", (h, i), lambda: w.zeros(h, i)),
        ]
    plan += [("model.norm.weight", (h,), lambda: w.ones(h)), ("lm_head.weight", (s.vocab, h), w.target_head)]
    return plan


def draft_plan(w: _Weights) -> list[tuple[str, tuple[int, ...], TensorFn]]:
    """EAGLE-3 checkpoint names as SGLang's LlamaForCausalLMEagle3.load_weights maps them (midlayer -> layers.0)."""
    s = w.spec
    h, v = s.hidden, s.vocab
    plan: list[tuple[str, tuple[int, ...], TensorFn]] = [
        ("embed_tokens.weight", (v, h), w.embed),
        ("fc.weight", (h, 3 * h), w.draft_fc),
        ("midlayer.input_layernorm.weight", (h,), lambda: w.ones(h)),
        ("midlayer.hidden_norm.weight", (h,), lambda: w.ones(h)),
    ]
    plan += _attn_plan(w, "midlayer", 2 * h)
    plan += [
        ("midlayer.post_attention_layernorm.weight", (h,), lambda: w.ones(h)),
        ("midlayer.mlp.gate_proj.weight", (v, h), w.draft_gate),
        ("midlayer.mlp.up_proj.weight", (v, h), w.draft_up),
        ("midlayer.mlp.down_proj.weight", (h, v), w.draft_down),
        ("norm.weight", (h,), lambda: w.ones(h)),
        ("lm_head.weight", (v, h), w.draft_head),
    ]
    return plan


# ------------------------------------------------------------------------------------------------- the files


def _common_config(spec: ModelSpec) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "hidden_size": spec.hidden,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "rope_scaling": None,
        "max_position_embeddings": spec.max_position_embeddings,
        "vocab_size": spec.vocab,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": WEIGHT_STD,
        "pretraining_tp": 1,
        "use_cache": True,
        "torch_dtype": spec.dtype,
        "dtype": spec.dtype,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": None,
    }


def target_config(spec: ModelSpec) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        **_common_config(spec),
        "num_hidden_layers": spec.layers,
        "intermediate_size": spec.intermediate,
    }


def draft_config(spec: ModelSpec) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        **_common_config(spec),
        "num_hidden_layers": 1,
        "intermediate_size": spec.vocab,
        "draft_vocab_size": spec.vocab,
        "target_hidden_size": spec.hidden,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": spec.aux_layer_ids(), "use_aux_hidden_state": True},
        "sm120kit_construction": {
            "alpha": spec.alpha,
            "seed": spec.seed,
            "draft_error": spec.draft_error,
        },
    }


def char_pieces(spec: ModelSpec) -> list[str]:
    """The character pieces at the top of the vocabulary ("c" and "##c" for every printable ASCII character), so
    any text, the bench's unique request tags included, tokenizes into distinct ids instead of <unk> (with <unk>
    every prompt is the same token sequence and the server's prefix cache answers 95 % of it: seen on the H200).
    None for a vocabulary too small to hold them beside 16 words."""
    chars = [chr(c) for c in range(33, 127)]
    pieces = [*chars, *(f"##{c}" for c in chars)]
    return pieces if spec.regular >= len(pieces) + 16 else []


def build_tokenizer(spec: ModelSpec) -> Any:
    """A WordPiece `tokenizers.Tokenizer`: the special tokens, the words "w0".."w{n-1}", then the character pieces
    (`char_pieces`) in the last ids; a word not in the vocabulary is spelled in character pieces."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    pieces = char_pieces(spec)
    words = spec.regular - len(pieces)
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{k}": N_SPECIAL + k for k in range(words)})
    vocab.update({piece: N_SPECIAL + words + k for k, piece in enumerate(pieces)})
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="<unk>", continuing_subword_prefix="##"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def _tokenizer_files(spec: ModelSpec, out: Path) -> None:
    build_tokenizer(spec).save(str(out / "tokenizer.json"))
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
        | {"special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": spec.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": added,
    }
    _write_json(out / "tokenizer_config.json", tokenizer_config)
    _write_json(out / "special_tokens_map.json", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def _shards(plan: Sequence[tuple[str, tuple[int, ...], TensorFn]], itemsize: int, limit: int) -> list[list[int]]:
    shards: list[list[int]] = [[]]
    size = 0
    for idx, (_, shape, _) in enumerate(plan):
        n = math.prod(shape) * itemsize
        if shards[-1] and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append(idx)
        size += n
    return shards


def _write_weights(
    plan: Sequence[tuple[str, tuple[int, ...], TensorFn]], out: Path, itemsize: int, shard_bytes: int, log: Any
) -> int:
    from safetensors.torch import save_file

    shards = _shards(plan, itemsize, shard_bytes)
    weight_map: dict[str, str] = {}
    total = 0
    for k, idxs in enumerate(shards):
        name = "model.safetensors" if len(shards) == 1 else f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors: dict[str, torch.Tensor] = {}
        for idx in idxs:
            tname, shape, fn = plan[idx]
            t = fn()
            if tuple(t.shape) != shape:
                raise AssertionError(f"{tname}: {tuple(t.shape)} != planned {shape}")
            tensors[tname] = t.contiguous().cpu()
            weight_map[tname] = name
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        save_file(tensors, str(out / name), metadata={"format": "pt"})
        (out / name).chmod(0o644)
        total += nbytes
        log(f"  {out.name}/{name}: {len(tensors)} tensors, {nbytes / 1e9:.3f} GB")
        del tensors
    if len(shards) > 1:
        _write_json(out / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
    return total


def _write_one(
    w: _Weights,
    out: Path,
    config: dict[str, Any],
    plan: Sequence[tuple[str, tuple[int, ...], TensorFn]],
    shard_bytes: int,
    log: Any,
) -> int:
    out.mkdir(parents=True)
    _write_json(out / "config.json", config)
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "do_sample": False, "temperature": 1.0, "top_p": 1.0},
    )
    _tokenizer_files(w.spec, out)
    return _write_weights(plan, out, w.spec.torch_dtype.itemsize, shard_bytes, log)


@dataclass(frozen=True)
class Written:
    target: Path
    draft: Path
    bytes: int
    seconds: float


def write_pair(
    spec: ModelSpec,
    out: Path,
    *,
    device: str = "cpu",
    force: bool = False,
    shard_bytes: int = SHARD_BYTES,
    log: Any = print,
) -> Written:
    """Write out/target and out/draft atomically (into out/.tmp-*, renamed into place at the end)."""
    out = Path(out)
    if out.exists() and any(p for p in out.iterdir() if not p.name.startswith(".tmp-")) and not force:
        raise FileExistsError(f"{out} is not empty (use --force to replace it)")
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    tmp = out / f".tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        w = _Weights(spec, device)
        total = _write_one(w, tmp / "target", target_config(spec), target_plan(w), shard_bytes, log)
        total += _write_one(w, tmp / "draft", draft_config(spec), draft_plan(w), shard_bytes, log)
        for name in ("target", "draft"):
            dest = out / name
            if dest.exists():
                shutil.rmtree(dest)
            (tmp / name).rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    seconds = time.monotonic() - start
    log(f"wrote {out}/target and {out}/draft: {total} bytes ({total / 1e9:.2f} GB) in {seconds:.1f} s")
    return Written(out / "target", out / "draft", total, seconds)


# ------------------------------------------------------------------------------------------------- reading back


def load_weights(model_dir: Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        tensors.update(load_file(str(path), device=device))
    return tensors


# ------------------------------------------------------------------------------------------------- reference forward
# A torch mirror of SGLang 0.5.16's computation (see the module docstring). `Emu` rounds every op's output to the
# model dtype while computing in float32, as the GPU kernels do (bf16 in, fp32 accumulate, bf16 out).


@dataclass(frozen=True)
class Emu:
    dtype: torch.dtype = torch.float32

    def r(self, x: torch.Tensor) -> torch.Tensor:
        """Round to the model dtype, keep computing in float32."""
        return x.to(self.dtype).to(torch.float32)

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.r(x @ w.to(torch.float32).T)

    def rmsnorm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """RMSNorm.forward_native: returns (normed, new residual); new residual = x (+ residual) in the model dtype."""
        if residual is not None:
            x = x + residual
        res = self.r(x)
        y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
        return self.r(y * weight.to(torch.float32)), res

    def silu_and_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.r(torch.nn.functional.silu(gate) * up)


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding (rotate_half) over the last dim of [T, heads, head_dim]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    ang = positions.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, dim=-1)[:, None, :], torch.cat([ang.sin()] * 2, dim=-1)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _attention(
    emu: Emu, x: torch.Tensor, wts: dict[str, torch.Tensor], prefix: str, spec: ModelSpec, positions: torch.Tensor
) -> torch.Tensor:
    """LlamaAttention over one causal sequence x [T, in] at positions 0..T-1, or T one-token sequences (all 0)."""
    t = x.shape[0]
    q = emu.linear(x, wts[f"{prefix}.self_attn.q_proj.weight"]).view(t, spec.heads, spec.head_dim)
    k = emu.linear(x, wts[f"{prefix}.self_attn.k_proj.weight"]).view(t, spec.kv_heads, spec.head_dim)
    v = emu.linear(x, wts[f"{prefix}.self_attn.v_proj.weight"]).view(t, spec.kv_heads, spec.head_dim)
    q, k = emu.r(_rope(q, positions, spec.rope_theta)), emu.r(_rope(k, positions, spec.rope_theta))
    rep = spec.heads // spec.kv_heads
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    if bool((positions == 0).all()):  # a batch of one-token sequences: each attends to itself only
        o = v.reshape(t, spec.heads * spec.head_dim)
    else:
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(spec.head_dim)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(mask[None], float("-inf"))
        o = emu.r(torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v).reshape(t, spec.heads * spec.head_dim))
    return emu.linear(o, wts[f"{prefix}.self_attn.o_proj.weight"])


def _mlp(emu: Emu, x: torch.Tensor, wts: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    gate = emu.linear(x, wts[f"{prefix}.mlp.gate_proj.weight"])
    up = emu.linear(x, wts[f"{prefix}.mlp.up_proj.weight"])
    return emu.linear(emu.silu_and_mul(gate, up), wts[f"{prefix}.mlp.down_proj.weight"])


def reference_target(
    wts: dict[str, torch.Tensor], spec: ModelSpec, ids: torch.Tensor, positions: torch.Tensor, emu: Emu
) -> tuple[torch.Tensor, torch.Tensor]:
    """LlamaForCausalLM with EAGLE-3 capture: (logits [T, V], aux [T, 3H] = cat of the captured streams)."""
    capture = [i + 1 for i in spec.aux_layer_ids()]
    hidden = emu.r(wts["model.embed_tokens.weight"].to(torch.float32)[ids])
    residual: torch.Tensor | None = None
    aux: list[torch.Tensor] = []
    eps = spec.rms_norm_eps
    for i in range(spec.layers):
        p = f"model.layers.{i}"
        if i in capture:
            assert residual is not None
            aux.append(emu.r(hidden + residual))
        if residual is None:
            residual = hidden
            x, _ = emu.rmsnorm(hidden, wts[f"{p}.input_layernorm.weight"], eps)
        else:
            x, residual = emu.rmsnorm(hidden, wts[f"{p}.input_layernorm.weight"], eps, residual)
        x = _attention(emu, x, wts, p, spec, positions)
        x, residual = emu.rmsnorm(x, wts[f"{p}.post_attention_layernorm.weight"], eps, residual)
        hidden = _mlp(emu, x, wts, p)
    out, _ = emu.rmsnorm(hidden, wts["model.norm.weight"], eps, residual)
    return emu.linear(out, wts["lm_head.weight"]), torch.cat(aux, dim=-1)


def reference_draft(
    wts: dict[str, torch.Tensor],
    spec: ModelSpec,
    ids: torch.Tensor,
    hidden_in: torch.Tensor,
    positions: torch.Tensor,
    emu: Emu,
    embed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LlamaForCausalLMEagle3: (logits [T, V], aux [T, H], the pre-norm sum handed to the next step).

    `embed` is the embedding SGLang puts in (the target's, by set_embed); the draft's own when None.
    """
    eps = spec.rms_norm_eps
    table = wts["embed_tokens.weight"] if embed is None else embed
    embeds = emu.r(table.to(torch.float32)[ids])
    hidden = emu.r(hidden_in.to(torch.float32))
    if hidden.shape[-1] != embeds.shape[-1]:
        hidden = emu.linear(hidden, wts["fc.weight"])
    residual = hidden
    h, _ = emu.rmsnorm(hidden, wts["midlayer.hidden_norm.weight"], eps)
    e, _ = emu.rmsnorm(embeds, wts["midlayer.input_layernorm.weight"], eps)
    x = _attention(emu, torch.cat([e, h], dim=-1), wts, "midlayer", spec, positions)
    x, residual = emu.rmsnorm(x, wts["midlayer.post_attention_layernorm.weight"], eps, residual)
    x = _mlp(emu, x, wts, "midlayer")
    to_logits, to_aux = emu.rmsnorm(x, wts["norm.weight"], eps, residual)
    return emu.linear(to_logits, wts["lm_head.weight"]), to_aux


def draft_chains(
    target: dict[str, torch.Tensor], draft: dict[str, torch.Tensor], spec: ModelSpec, steps: int, emu: Emu
) -> tuple[torch.Tensor, torch.Tensor]:
    """For every id s as the previous token: the target's aux at s, then the draft's `steps` chained proposals.

    Row s of the result is what the draft proposes after the target emitted f(s) following s (one-token rows: the
    attention's o_proj is zero in both models, so positions and context do not change any output). Returns
    (target argmax [V], proposals [V, steps]).
    """
    ids = torch.arange(spec.vocab)
    pos = torch.zeros_like(ids)
    logits, aux = reference_target(target, spec, ids, pos, emu)
    nxt = logits.argmax(dim=-1)
    embed = target["model.embed_tokens.weight"]
    props: list[torch.Tensor] = []
    hidden, tok = aux, nxt
    for _ in range(steps):
        dl, hidden = reference_draft(draft, spec, tok, hidden, pos, emu, embed)
        tok = dl.argmax(dim=-1)
        props.append(tok)
    return nxt, torch.stack(props, dim=1)


def margins(logits: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Logit of `want` minus the best other logit, per row (positive: argmax is `want`)."""
    got = logits.gather(1, want[:, None])[:, 0]
    other = logits.scatter(1, want[:, None], float("-inf")).max(dim=1).values
    return got - other


def check_pair(
    spec: ModelSpec, device: str, log: Any = print, chunk: int = 2048, ids: int | None = None
) -> dict[str, float]:
    """In memory, the model dtype emulated: target argmax = f and the draft's first step = sigma(f(f(s))).

    Every id, or the first `ids` of them (a CPU can check the 7B shape's heads and V-wide MLP only in part).
    """
    w = _Weights(spec, device)
    emu = Emu(spec.torch_dtype)
    ones = torch.ones(spec.hidden, device=w.device)
    eps = spec.rms_norm_eps
    t_margins: list[torch.Tensor] = []
    d_margins: list[torch.Tensor] = []
    errs: list[torch.Tensor] = []
    with torch.no_grad():
        e_all = w.embed().to(torch.float32)
        f_all = w._f()
        sigma = torch.tensor(w.maps.sigma, device=w.device)
        t_head, d_head, fc = w.target_head(), w.draft_head(), w.draft_fc()
        gate, up, down = w.draft_gate(), w.draft_up(), w.draft_down()
        for lo in range(0, spec.vocab if ids is None else min(ids, spec.vocab), chunk):
            hi = lo + chunk if ids is None else min(lo + chunk, ids)
            e, f = e_all[lo:hi], f_all[lo:hi]
            norm_e, _ = emu.rmsnorm(e, ones, eps)
            t_margins.append(margins(emu.linear(norm_e, t_head), f))
            x = emu.linear(torch.cat([e, e, e], dim=1), fc)  # the draft's step from the target's aux [e; e; e]
            h, res = emu.rmsnorm(torch.zeros_like(x), ones, eps, x)
            mlp = emu.linear(emu.silu_and_mul(emu.linear(h, gate), emu.linear(h, up)), down)
            out, aux = emu.rmsnorm(mlp, ones, eps, res)
            d_margins.append(margins(emu.linear(out, d_head), sigma[f_all[f]]))
            errs.append((aux - e_all[f]).norm(dim=1) / e_all[f].norm(dim=1))
    t_margin, d_margin, state_err = torch.cat(t_margins), torch.cat(d_margins), torch.cat(errs)
    result = {
        "target_min_margin": float(t_margin.min()),
        "target_wrong": float((t_margin <= 0).sum()),
        "draft_min_margin": float(d_margin.min()),
        "draft_wrong": float((d_margin <= 0).sum()),
        "draft_state_rel_err_max": float(state_err.max()),
    }
    log("check: " + ", ".join(f"{k} {v:.4g}" for k, v in result.items()))
    return result


# ------------------------------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sglang_models.py", description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    wp = sub.add_parser("write", help="write DIR/target and DIR/draft")
    d = ModelSpec()
    wp.add_argument("--out", type=Path, required=True)
    wp.add_argument("--layers", type=int, default=d.layers)
    wp.add_argument("--hidden", type=int, default=d.hidden)
    wp.add_argument("--intermediate", type=int, default=d.intermediate)
    wp.add_argument("--vocab", type=int, default=d.vocab)
    wp.add_argument("--heads", type=int, default=d.heads)
    wp.add_argument("--kv-heads", type=int, default=d.kv_heads)
    wp.add_argument("--seed", type=int, default=d.seed)
    wp.add_argument("--draft-error", type=float, default=d.draft_error)
    wp.add_argument("--alpha", type=float, default=d.alpha)
    wp.add_argument("--max-position-embeddings", type=int, default=d.max_position_embeddings)
    wp.add_argument("--dtype", choices=sorted(DTYPES), default=d.dtype)
    wp.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    wp.add_argument("--shard-gb", type=float, default=SHARD_BYTES / 1024**3)
    wp.add_argument("--force", action="store_true", help="replace a non-empty --out")
    wp.add_argument("--check", action="store_true", help="first check every id's target and draft argmax in memory")
    args = ap.parse_args(argv)
    spec = ModelSpec(
        layers=args.layers,
        hidden=args.hidden,
        intermediate=args.intermediate,
        vocab=args.vocab,
        heads=args.heads,
        kv_heads=args.kv_heads,
        seed=args.seed,
        draft_error=args.draft_error,
        dtype=args.dtype,
        alpha=args.alpha,
        max_position_embeddings=args.max_position_embeddings,
    )
    if args.check:
        r = check_pair(spec, args.device)
        if r["target_wrong"] or (spec.draft_error == 0 and r["draft_wrong"]):
            print("check failed", file=sys.stderr)
            return 1
    maps = token_maps(spec)
    print(
        f"accept length expected (num_steps 3, topk 1): {expected_accept_length(spec.draft_error, 3):.3f}"
        f" (exact for |S| = {len(maps.error_set)}: {exact_accept_length(spec.regular, len(maps.error_set), 3):.3f})"
    )
    with contextlib.suppress(BrokenPipeError):
        write_pair(spec, args.out, device=args.device, force=args.force, shard_bytes=int(args.shard_gb * 1024**3))
    return 0


def iter_trajectory(maps: TokenMaps, start: int, n: int) -> Iterator[int]:
    tok = start
    for _ in range(n):
        tok = maps.f[tok]
        yield tok


if __name__ == "__main__":
    sys.exit(main())
