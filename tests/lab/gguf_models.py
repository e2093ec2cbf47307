"""Two tiny Llama GGUF models for llama-server on CPU: TARGET and a DRAFT that predicts it (real-engine.md, "Models").

Both share one byte-level BPE vocabulary (gpt2 tokenizer, `default` pre-tokenizer: 256 byte symbols, merges learnt
from the small English corpus below, three ChatML control tokens) and a ChatML chat template. Weights are f32,
random from a seed:
- Residual dimension 0 is held at 3.0: embedding column 0 is 3.0 and row 0 of every `attn_output` and `ffn_down` is
  zero. The output head gives every token that is not printable ASCII a weight of -20 there, so the models only ever
  emit printable text, never a control token (a bench with ignore_eos always gets its full output length).
- DRAFT is one live layer. TARGET is that layer plus `extra_layers` compute-only layers whose `attn_output` and
  `ffn_down` are zero: they cost compute and add nothing, so TARGET's greedy output equals DRAFT's.
- `draft_noise` adds Gaussian noise (that fraction of the head's std) to DRAFT's output head only: 0 gives 100 %
  acceptance, 0.1 about 45-49 %.

Written once per machine: cached beside the llama-server build, keyed by the parameters and seed.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .llamacpp import LlamaServerBuild, build_dir

WRITER_VERSION = 1  # bump when the weights or vocabulary written for the same parameters change
CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
    " + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Pre-tokenizer of llama.cpp's `default` (GPT-2) split, close enough for learning merges.
_WORDS = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+")
CORPUS = """\
The quick brown fox jumps over the lazy dog while the farmer watches from the door of the old barn. In the
morning the village wakes slowly: bakers light their ovens, children walk to school, and the river carries small
boats toward the market in the town. People talk about the weather, the price of bread, the news from the city,
and the long road that runs across the hills to the sea. A good day starts with a cup of tea and a quiet moment
at the window, looking at the garden where the roses and the apple trees grow. The teacher asks the students to
read a story about a sailor who travels around the world, meets strange people, learns new languages and comes
home with a box of letters. Some of them write their own stories in the afternoon; others play in the field
behind the school until the sun goes down. In the evening the families gather for dinner, share what happened
during the day, and plan the work for tomorrow. The library in the centre of the town is open every day except
Sunday. It holds thousands of books on history, science, music and art, and many readers come to study there.
Scientists measure the time it takes for light to travel through water, and engineers build bridges that stand
for a hundred years. Every machine needs power, every program needs memory, and every server answers requests as
fast as it can. When the number of users grows, the system must share its time between them, and each request
waits a little longer for its turn. A careful test counts every token, every second and every byte that moves
between the client and the server, because a number that nobody checked is only a guess. The market closes at
six, the lights go out in the shops, and the streets become quiet again under the stars of a clear night.
"""


@dataclass(frozen=True)
class ModelParams:
    """Shapes and randomness of the pair (real-engine.md's defaults)."""

    n_embd: int = 512
    n_head: int = 8
    n_ff: int = 2048
    n_ctx: int = 4096
    n_merges: int = 374
    extra_layers: int = 7  # TARGET's compute-only layers on top of the shared live layer
    draft_noise: float = 0.0
    seed: int = 0

    def key(self) -> str:
        text = json.dumps({**asdict(self), "writer": WRITER_VERSION}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ModelPair:
    target: Path
    draft: Path
    params: ModelParams
    n_vocab: int


def _byte_symbols() -> list[str]:
    """GPT-2's byte -> printable unicode map (what a gpt2 vocabulary stores its byte tokens as)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    table = dict(zip(printable, codes, strict=True))
    return [chr(table[b]) for b in range(256)]


def learn_vocab(n_merges: int) -> tuple[list[str], list[str], list[bytes]]:
    """Tokens (unicode form), merges ("a b") and each token's bytes, learnt from CORPUS deterministically."""
    symbols = _byte_symbols()
    text = " ".join(CORPUS.split())
    words = Counter(tuple(symbols[b] for b in w.encode()) for w in _WORDS.findall(text))
    tokens = list(symbols)
    token_bytes = [bytes([b]) for b in range(256)]
    byte_of = {s: bytes([b]) for b, s in enumerate(symbols)}
    merges: list[str] = []
    while len(merges) < n_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in itertools.pairwise(word):
                pairs[pair] += count
        if not pairs:
            raise ValueError(f"the corpus gives only {len(merges)} merges, fewer than n_merges {n_merges}")
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merged = best[0] + best[1]
        merges.append(f"{best[0]} {best[1]}")
        tokens.append(merged)
        byte_of[merged] = byte_of[best[0]] + byte_of[best[1]]
        token_bytes.append(byte_of[merged])
        new_words: Counter[tuple[str, ...]] = Counter()
        for word, count in words.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new_words[tuple(out)] += count
        words = new_words
    return tokens, merges, token_bytes


def _printable(data: bytes) -> bool:
    return bool(data) and all(0x20 <= b <= 0x7E for b in data)


def _layer(rng: np.random.Generator, p: ModelParams, live: bool) -> dict[str, np.ndarray]:
    e, f = p.n_embd, p.n_ff

    def w(rows: int, cols: int, std: float) -> np.ndarray:
        return rng.normal(0.0, std, (rows, cols)).astype(np.float32)

    out = {
        "attn_norm.weight": np.ones(e, np.float32),
        "attn_q.weight": w(e, e, 0.05),
        "attn_k.weight": w(e, e, 0.05),
        "attn_v.weight": w(e, e, 0.05),
        "attn_output.weight": w(e, e, 0.05) if live else np.zeros((e, e), np.float32),
        "ffn_norm.weight": np.ones(e, np.float32),
        "ffn_gate.weight": w(f, e, 0.05),
        "ffn_up.weight": w(f, e, 0.05),
        "ffn_down.weight": w(e, f, 0.03) if live else np.zeros((e, f), np.float32),
    }
    out["attn_output.weight"][0, :] = 0.0  # residual dimension 0 stays constant
    out["ffn_down.weight"][0, :] = 0.0
    return out


def _write(
    path: Path,
    gguf: object,
    p: ModelParams,
    vocab: tuple[list[str], list[str], list[bytes]],
    tensors: dict[str, object],
) -> None:
    tokens, merges, _ = vocab
    n_layer = sum(1 for name in tensors if name.endswith(".attn_q.weight"))
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    writer = gguf.GGUFWriter(str(tmp), "llama")  # type: ignore[attr-defined]
    writer.add_name(path.stem)
    writer.add_context_length(p.n_ctx)
    writer.add_embedding_length(p.n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(p.n_ff)
    writer.add_head_count(p.n_head)
    writer.add_head_count_kv(p.n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(p.n_embd // p.n_head)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens) + len(CONTROL_TOKENS))
    writer.add_file_type(0)  # all f32
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([*tokens, *CONTROL_TOKENS])
    writer.add_token_types([1] * len(tokens) + [3] * len(CONTROL_TOKENS))  # NORMAL, CONTROL
    writer.add_token_merges(merges)
    base = len(tokens)
    writer.add_bos_token_id(base)
    writer.add_eos_token_id(base + 2)
    writer.add_eot_token_id(base + 2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(path)


def write_models(build: LlamaServerBuild, params: ModelParams, out_dir: Path) -> ModelPair:
    """Write TARGET and DRAFT for `params` into out_dir (no cache): target.gguf, draft.gguf."""
    if str(build.gguf_py) not in sys.path:
        sys.path.insert(0, str(build.gguf_py))
    import gguf  # llama.cpp's own writer, copied beside the binary by llamacpp.py

    vocab = learn_vocab(params.n_merges)
    n_vocab = len(vocab[0]) + len(CONTROL_TOKENS)
    rng = np.random.default_rng(params.seed)
    e = params.n_embd
    embd = rng.normal(0.0, 1.0, (n_vocab, e)).astype(np.float32)
    embd[:, 0] = 3.0
    head = rng.normal(0.0, 0.05, (n_vocab, e)).astype(np.float32)
    allowed = [_printable(b) for b in vocab[2]] + [False] * len(CONTROL_TOKENS)
    head[:, 0] = np.where(allowed, 0.0, -20.0).astype(np.float32)
    live = _layer(rng, params, live=True)
    shared = {"token_embd.weight": embd, "output_norm.weight": np.ones(e, np.float32)}
    target: dict[str, object] = {**shared, "output.weight": head}
    target.update({f"blk.0.{k}": v for k, v in live.items()})
    for i in range(1, params.extra_layers + 1):
        target.update({f"blk.{i}.{k}": v for k, v in _layer(rng, params, live=False).items()})
    draft_head = head.copy()
    if params.draft_noise:  # the head's columns 1.. only: the printable-ASCII mask in column 0 stays exact
        std = params.draft_noise * float(head[:, 1:].std())
        noise = np.random.default_rng(params.seed + 1).normal(0.0, std, (n_vocab, e - 1))
        draft_head[:, 1:] += noise.astype(np.float32)
    draft: dict[str, object] = {**shared, "output.weight": draft_head}
    draft.update({f"blk.0.{k}": v for k, v in live.items()})
    out_dir.mkdir(parents=True, exist_ok=True)
    _write(out_dir / "target.gguf", gguf, params, vocab, target)
    _write(out_dir / "draft.gguf", gguf, params, vocab, draft)
    return ModelPair(out_dir / "target.gguf", out_dir / "draft.gguf", params, n_vocab)


def cached_models(build: LlamaServerBuild, params: ModelParams) -> ModelPair:
    """TARGET and DRAFT for `params`, written once per machine beside the llama-server build."""
    root = build_dir(build.version).parent / "models" / params.key()
    done = root / "params.json"
    if done.is_file() and (root / "target.gguf").is_file() and (root / "draft.gguf").is_file():
        n_vocab = int(json.loads(done.read_text())["n_vocab"])
        return ModelPair(root / "target.gguf", root / "draft.gguf", params, n_vocab)
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{params.key()}.", dir=root.parent))
    try:
        pair = write_models(build, params, staging)
        (staging / "params.json").write_text(json.dumps({**asdict(params), "n_vocab": pair.n_vocab}) + "\n")
        with contextlib.suppress(OSError):  # another process finished first: use its copy
            staging.rename(root)
    finally:
        if staging.exists():
            for child in staging.iterdir():
                child.unlink()
            staging.rmdir()
    return cached_models(build, params)
