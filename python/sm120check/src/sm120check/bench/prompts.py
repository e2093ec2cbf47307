"""Prompts for the sweep: a user's file, or synthetic English text of about the asked length.

A server's prompt cache (SGLang's radix cache, llama.cpp's slot and RAM caches) answers a prompt it has seen
before, so a different first word per request is not enough: the same request sent again, at the next level or in
the next run, is a cache hit. `unique_prompt` therefore puts a tag made of the run id, the level and the request's
index first in every prompt (synthetic or from --prompt-file), unless the user allows reuse. Lengths are in words
(no tokenizer on a bare node); English text runs at about 1.3 tokens per word for common tokenizers.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from sm120check import bounded
from sm120check.bench.datasets import MAX_DATASET_BYTES

MAX_PROMPT_FILE_BYTES = MAX_DATASET_BYTES  # the same bound as --dataset: both are read into memory whole

_PASSAGE = str.split(
    "The operators of a small inference cluster keep a notebook of every change they make to the serving stack. "
    "Each entry records the driver, the toolkit, the library versions and the measured throughput before and after. "
    "When a change helps a single user but hurts a busy server they write down both numbers and the load they saw. "
    "Explain in plain words how batching, memory bandwidth and communication between the cards shape that trade-off, "
    "and describe what a careful engineer would measure next, step by step, before changing the configuration again."
)


def synthetic_prompts(count: int, words: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        start = rng.randrange(len(_PASSAGE))
        body = [_PASSAGE[(start + k) % len(_PASSAGE)] for k in range(max(words - 4, 1))]
        prompts.append(f"Request {i} {rng.randrange(10**6)}: " + " ".join(body))
    return prompts


def output_len(mean: int, spread: float, seed: int, level: int, index: int) -> int:
    """Request `index` of `level`'s output length: `mean` when `spread` is 0, else uniform in mean x (1 +- spread)
    (at least 1), drawn from (seed, level, index) alone, so every server of a comparison is asked the same lengths."""
    if spread <= 0:
        return mean
    low, high = max(1, round(mean * (1 - spread))), max(1, round(mean * (1 + spread)))
    return random.Random(f"output-len:{seed}:{level}:{index}").randint(low, high)


def unique_prompt(body: str, run_id: str, level: int, index: int) -> str:
    """`body` with a tag no other request of any run shares, as its first words, most varying part first: the
    request's index, then the level, then the run id. A prefix cache matches from the first token, so a tag that
    began with the run id (shared by every request of the run) was a cache hit of its own (see finding
    bench-prompt-tag-cache-hit)."""
    return f"[#{index} C{level} {run_id}] {body}"


def load_prompt_file(path: Path, max_bytes: int = MAX_PROMPT_FILE_BYTES) -> list[str]:
    """One prompt per line; JSONL lines may be {"prompt": ...} or {"text": ...}. Bounded like --dataset."""
    try:
        lines = bounded.read_text(path, max_bytes).splitlines()
    except bounded.TooLarge as exc:
        raise ValueError(f"--prompt-file {exc}, read into memory; use a subset of its lines") from None
    except bounded.NotText as exc:
        raise ValueError(f"--prompt-file {exc}") from None
    except bounded.Unreadable as exc:
        raise ValueError(f"--prompt-file {exc}; give a text file, one prompt per line") from None
    prompts: list[str] = []
    for number, line in enumerate(lines, start=1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except (ValueError, RecursionError) as exc:
                raise ValueError(f"--prompt-file {path}:{number}: bad JSON ({exc})") from None
            text = data.get("prompt", data.get("text")) if isinstance(data, dict) else None
            if not isinstance(text, str):
                raise ValueError(f'--prompt-file {path}:{number}: JSON lines need a "prompt" or "text" string')
            prompts.append(text)
        else:
            prompts.append(line)
    if not prompts:
        raise ValueError(f"--prompt-file {path} holds no prompts (one per line, or JSONL with a prompt field)")
    return prompts
