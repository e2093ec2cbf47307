"""The three request shapes the bench speaks, and how each one reports the tokens it streamed.

Tokens are counted from what the server says, never one per chunk (a speculative server sends several tokens in
one chunk): SGLang's cumulative `meta_info.completion_tokens`; OpenAI `usage.completion_tokens` per chunk with
`continuous_usage_stats` (a running count: source `usage`); or one final total, in a usage-only event (vLLM, SGLang,
llama.cpp chat) or in the last event together with `choices` and a `finish_reason` when no earlier event had usage
(llama.cpp completions). A final total is spread over the text chunks: one token each when it equals their number
(llama.cpp sends one token per event: source `usage-per-event`), else by text length (source `usage-split`).

Also read, where the server says: cached prompt tokens (llama.cpp `timings.cache_n`, OpenAI
`usage.prompt_tokens_details.cached_tokens`) and llama.cpp's per-request drafting (`timings.draft_n`,
`timings.draft_n_accepted`).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field


class Api(str, enum.Enum):
    OPENAI_COMPLETIONS = "openai-completions"
    OPENAI_CHAT = "openai-chat"
    SGLANG = "sglang"


PATHS = {Api.OPENAI_COMPLETIONS: "/v1/completions", Api.OPENAI_CHAT: "/v1/chat/completions", Api.SGLANG: "/generate"}


@dataclass(frozen=True)
class RequestSpec:
    prompt: str
    output_len: int
    temperature: float = 0.0
    ignore_eos: bool = True
    model: str = ""
    cache_prompt: bool | None = None  # llama.cpp's `cache_prompt`; None: not sent (SGLang and vLLM reject it)


def build_body(api: Api, spec: RequestSpec) -> dict[str, object]:
    if api is Api.SGLANG:
        sampling: dict[str, object] = {"max_new_tokens": spec.output_len, "temperature": spec.temperature}
        if spec.ignore_eos:
            sampling["ignore_eos"] = True
        return {"text": spec.prompt, "sampling_params": sampling, "stream": True}
    body: dict[str, object] = {
        "model": spec.model,
        "max_tokens": spec.output_len,
        "temperature": spec.temperature,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if spec.ignore_eos:
        body["ignore_eos"] = True  # vLLM and SGLang extension: fixed output lengths
    if spec.cache_prompt is not None:
        body["cache_prompt"] = spec.cache_prompt
    if api is Api.OPENAI_CHAT:
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    return body


class StreamFormatError(ValueError):
    """An event the bench cannot read (not JSON, or an error object from the server)."""


@dataclass
class StreamTally:
    """What one streamed response said, chunk by chunk.

    `chunks` holds (arrival time, tokens or None when only text arrived, text length). Cumulative counts from the
    server fill the token numbers; `finish` spreads a final usage count over chunks that had none.
    """

    chunks: list[tuple[float, int | None, int]] = field(default_factory=list)
    counted: int = 0  # tokens accounted to chunks so far from cumulative counts
    usage_total: int | None = None
    prompt_tokens: int | None = None
    spec_verify_ct: int | None = None
    cached_prompt_tokens: int | None = None
    draft_tokens: int | None = None  # llama.cpp timings.draft_n: tokens drafted for this request
    draft_accepted: int | None = None  # llama.cpp timings.draft_n_accepted
    finish_reason: str | None = None
    source: str = ""
    final_total: bool = False  # the count came as one total at the end, not as a running count
    server_lag: list[float] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)  # counts the server sent that cannot be true
    _sglang_text_len: int = 0

    def _anomaly(self, message: str) -> None:
        if message not in self.anomalies and len(self.anomalies) < 5:
            self.anomalies.append(message)

    def add_event(self, api: Api, data: str, now: float) -> bool:
        """Account one SSE data payload received at `now`; returns True at the end-of-stream marker."""
        if data == "[DONE]":
            return True
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):
            raise StreamFormatError(f"stream event is not JSON: {data[:120]!r}") from None
        if not isinstance(event, dict):
            raise StreamFormatError(f"stream event is not an object: {data[:120]!r}")
        if "error" in event and not event.get("choices") and "meta_info" not in event:
            raise StreamFormatError(f"server error in stream: {json.dumps(event['error'])[:300]}")
        stamp = event.get("sim_ts")
        if isinstance(stamp, (int, float)):
            self.server_lag.append(now - float(stamp))
        if api is Api.SGLANG:
            self._add_sglang(event, now)
        else:
            self._add_openai(api, event, now)
        return False

    def _add_sglang(self, event: dict[str, object], now: float) -> None:
        meta = event.get("meta_info")
        meta = meta if isinstance(meta, dict) else {}
        text = event.get("text")
        text_len = len(text) if isinstance(text, str) else 0
        delta_chars = max(0, text_len - self._sglang_text_len)  # text is cumulative unless incremental streaming
        self._sglang_text_len = max(self._sglang_text_len, text_len)
        cum = meta.get("completion_tokens")
        if isinstance(cum, int):
            self._cumulative(cum, now, delta_chars, "meta_info")
        elif delta_chars:
            self.chunks.append((now, None, delta_chars))
        # meta_info.cached_tokens: the prompt tokens SGLang's radix cache answered (0.5.x; seen on 0.5.16)
        fields = (("prompt_tokens", "prompt_tokens"), ("spec_verify_ct", "spec_verify_ct"))
        for key, attr in (*fields, ("cached_tokens", "cached_prompt_tokens")):
            value = meta.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                if value < 0:
                    self._anomaly(f"negative meta_info.{key} {value}")
                    continue
                setattr(self, attr, value)
        finish = meta.get("finish_reason")
        if isinstance(finish, dict):
            self.finish_reason = str(finish.get("type", finish))
        elif isinstance(finish, str):
            self.finish_reason = finish

    def _add_openai(self, api: Api, event: dict[str, object], now: float) -> None:
        chars = 0
        finished = False
        choices = event.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            choice = choices[0]
            if api is Api.OPENAI_CHAT:
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    for key in ("content", "reasoning_content"):
                        piece = delta.get(key)
                        chars += len(piece) if isinstance(piece, str) else 0
            else:
                piece = choice.get("text")
                chars = len(piece) if isinstance(piece, str) else 0
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = str(choice["finish_reason"])
                finished = True
        self._read_timings(event.get("timings"))
        usage = event.get("usage")
        if isinstance(usage, dict) and _count(usage.get("completion_tokens")) is not None:
            prompt = _count(usage.get("prompt_tokens"))
            if prompt is not None:
                self.prompt_tokens = prompt
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and _count(details.get("cached_tokens")) is not None:
                self.cached_prompt_tokens = _count(details.get("cached_tokens"))
            cum = int(usage["completion_tokens"])
            # a usage-only event, or the last event with choices when no earlier event had usage (llama.cpp
            # completions): a final total for the whole response, never a running count
            if not choices or (finished and self.source != "usage"):
                if cum < self.counted:
                    self._anomaly(f"final usage.completion_tokens {cum} below the running count {self.counted}")
                if chars and self.source != "usage":
                    self.chunks.append((now, None, chars))
                self.usage_total = cum
                if self.source == "usage" and cum > self.counted:
                    self.chunks.append((now, cum - self.counted, 0))
                    self.counted = cum
                elif self.source != "usage":
                    self.final_total = True
                return
            self._cumulative(cum, now, chars, "usage")
        elif chars:
            self.chunks.append((now, None, chars))

    def _read_timings(self, timings: object) -> None:
        """llama.cpp's per-request `timings` (final event): cache_n, draft_n, draft_n_accepted."""
        if not isinstance(timings, dict):
            return
        cached = _count(timings.get("cache_n"))
        if cached is not None:
            self.cached_prompt_tokens = cached
        drafted, accepted = _count(timings.get("draft_n")), _count(timings.get("draft_n_accepted"))
        if drafted is not None and accepted is not None:
            if accepted > drafted:
                self._anomaly(f"timings.draft_n_accepted {accepted} above draft_n {drafted}")
                return
            self.draft_tokens, self.draft_accepted = drafted, accepted

    def _cumulative(self, cum: int, now: float, chars: int, source: str) -> None:
        self.source = source
        if cum < self.counted or cum < 0:
            self._anomaly(f"cumulative {source} completion_tokens went from {self.counted} to {cum}")
        delta = cum - self.counted
        if delta > 0 or chars:
            self.chunks.append((now, max(delta, 0), chars))
        self.counted = max(self.counted, cum)
        self.usage_total = self.counted

    def finish(self) -> tuple[list[tuple[float, int]], str]:
        """Chunks as (time, tokens) and how the tokens were counted; raises when the server gave no counts."""
        unknown = [i for i, (_, tokens, _) in enumerate(self.chunks) if tokens is None]
        if not unknown:
            return [(t, n or 0) for t, n, _ in self.chunks], self.source or "usage"
        total = self.usage_total
        if total is None:
            raise StreamFormatError(
                "the server streamed text but no token counts (no usage, no meta_info.completion_tokens); "
                "use --api sglang against SGLang, or a server that honours stream_options.include_usage"
            )
        known = sum(n for _, n, _ in self.chunks if n is not None)
        left = max(0, total - known)
        chars = [self.chunks[i][2] for i in unknown]
        if left == len(unknown) and all(chars):  # one token per event, as llama.cpp streams
            per_event: list[tuple[float, int]] = [(t, n or 0) for t, n, _ in self.chunks]
            for i in unknown:
                per_event[i] = (self.chunks[i][0], 1)
            return per_event, "usage-per-event"
        total_chars = sum(chars) or 1
        shares = [left * c / total_chars for c in chars]
        floors = [int(s) for s in shares]
        # largest remainders get the tokens lost to rounding, so the sum stays exact
        order = sorted(range(len(shares)), key=lambda k: shares[k] - floors[k], reverse=True)
        for k in order[: left - sum(floors)]:
            floors[k] += 1
        result = [(t, n) for t, n, _ in self.chunks]
        for k, i in enumerate(unknown):
            result[i] = (self.chunks[i][0], floors[k])
        return [(t, n or 0) for t, n in result], "usage-split"


def _count(value: object) -> int | None:
    """A token count the server sent: a whole number >= 0, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
