"""Greedy requests that cross the speculation switch both ways, for the GPU tests that compare a switched server's
outputs with the plain server's token for token (tests/gpu/test_sglang_switch.py, tests/gpu/test_sglang_envelope.py).

40 requests at once, 4 of them long: they start plain in a batch of 40 (their prefill skips the draft where the
threshold is at most 40) and finish speculative alone. Then 4 long requests alone, joined 1 s later by 36 short ones:
they start speculative, run plain while the batch is large, and speculate again when it shrinks. Four OpenAI
completions go through /v1/completions. Every request is bounded by a timeout.
"""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

SHORT, LONG = 24, 320  # output tokens of the requests that leave a batch early, and of those that stay


class HasUrl(Protocol):
    url: str


def prompt(i: int) -> str:
    return " ".join(f"w{(i * 37 + k * 11) % 5000}" for k in range(12 + i % 9))


def _post(server: HasUrl, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{server.url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data


def generate(server: HasUrl, text: str, n: int, delay: float = 0.0) -> list[int]:
    time.sleep(delay)
    body = {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}}
    ids = _post(server, "/generate", body).get("output_ids")
    assert isinstance(ids, list), "no output_ids in the /generate response"
    return [int(t) for t in ids]


def completion(server: HasUrl, text: str, n: int) -> str:
    body = {"model": "default", "prompt": text, "temperature": 0, "max_tokens": n, "ignore_eos": True}
    return str(_post(server, "/v1/completions", body)["choices"][0]["text"])


def crossing(server: HasUrl) -> dict[str, list[int]]:
    """Greedy token ids of the two crossing patterns, by request name."""
    out: dict[str, list[int]] = {}
    with ThreadPoolExecutor(max_workers=48) as pool:
        first = {f"a{i}": pool.submit(generate, server, prompt(i), LONG if i < 4 else SHORT) for i in range(40)}
        out.update({k: f.result(timeout=300) for k, f in first.items()})
        second = {f"b{i}": pool.submit(generate, server, prompt(100 + i), LONG) for i in range(4)}
        second |= {f"b{i}": pool.submit(generate, server, prompt(100 + i), SHORT * 4, 1.0) for i in range(4, 40)}
        out.update({k: f.result(timeout=300) for k, f in second.items()})
    return out


def openai_outputs(server: HasUrl) -> dict[str, str]:
    return {f"o{i}": completion(server, prompt(200 + i), 48) for i in range(4)}


def outputs(server: HasUrl) -> dict[str, Any]:
    return {"crossing": crossing(server), "openai": openai_outputs(server)}


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def differ(base: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """Requests whose outputs differ: (length, first differing token) for token ids, the plain text for OpenAI's."""
    out: dict[str, Any] = {
        k: (len(v), first_difference(v, got["crossing"].get(k, [])))
        for k, v in base["crossing"].items()
        if got["crossing"].get(k) != v
    }
    out |= {k: v for k, v in base["openai"].items() if got["openai"].get(k) != v}
    return out
