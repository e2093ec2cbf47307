"""A simulated LLM server whose speculation crossover is known: for testing `bench` and `crossover` without a GPU.

It speaks the APIs the bench uses (OpenAI completions and chat with SSE and usage, SGLang /generate with
meta_info, /get_server_info, /v1/models, /health) on 127.0.0.1, and produces tokens with a discrete-event model of
continuous batching: every step serves all running requests (up to `max_batch`); a plain step takes a + b*B seconds
and gives each request one token, a speculative verify step takes c + d*B seconds and gives each request tau tokens
on average (floor or ceil of tau at random). A step forms its batch a moment (`admit_grace`, inside the step) after
it starts, so clients that resubmit at once keep the batch full. Throughputs are B/(a+bB) and tau*B/(c+dB), so
speculation wins below

    B* = (tau*a - c) / (d - tau*b)

and loses above it. Steps follow an absolute schedule (each ends at the previous end plus its duration), so the
Python overhead of serving a step does not stretch the simulated time unless the process is saturated.

    sm120check mock-server --mode spec --port 30000

(docs/bench.md "The simulated server"; the tests of bench and crossover start it the same way.)

`--flavour llamacpp` is a thin stand-in for llama.cpp's `llama-server`, for fast unit tests of the bench's client side
only: it copies llama.cpp's event shapes (docs/bench.md, "Against a real engine"), not llama.cpp's behaviour (the real
server is covered by the tests with a real llama-server). It sends one event per token; a completions stream ends with
an event holding `choices` (empty text, a finish_reason), `usage` and `timings`; a chat stream has a role event
(`content: null`), one `delta.content` event per token, a finish event with an empty delta, and a usage event (`choices:
[]`, `usage`, `timings`) only with `include_usage`; `continuous_usage_stats` is ignored. `/props`, `/slots` and
`/metrics` (`llamacpp:` names, counters updated when a request is released) answer; `/get_server_info`, `/server_info`
and `/generate` are 404. Its prompt cache: a prompt seen before reports `cache_n` = its prompt tokens - 1, unless the
request says `cache_prompt: false`. With speculation the first token comes from the prompt pass and every later step is
a verify step, reported as `timings.draft_n` (num_steps per verify step) and `draft_n_accepted` (the step's tokens - 1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import signal
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from sm120check import argtypes
from sm120check.aio import stop, within

_WRITE_HIGH_WATER = 256 * 1024
WRITE_STALL_S = 10.0  # a client whose full buffer takes no bytes for this long is dropped, not waited on


@dataclass(frozen=True)
class SimModel:
    mode: str = "plain"  # "plain" or "spec"
    a: float = 0.010  # plain step: a + b*B seconds
    b: float = 0.0004
    c: float = 0.013  # speculative verify step: c + d*B seconds
    d: float = 0.0012
    tau: float = 2.0  # mean tokens accepted per request per verify step
    max_batch: int = 4096
    seed: int = 0
    num_steps: int = 3  # reported as speculative_num_steps
    admit_grace: float = 0.003  # seconds a step waits, inside its own duration, for requests arriving right now
    start_batch: int = 1  # the first step waits until this many requests are in flight (a logical barrier)

    def __post_init__(self) -> None:
        if self.mode not in ("plain", "spec"):
            raise ValueError(f"mode {self.mode!r} must be 'plain' or 'spec'")
        if min(self.a, self.b, self.c, self.d) < 0 or self.tau < 1 or self.max_batch < 1:
            raise ValueError("step times must be >= 0, tau >= 1 and max_batch >= 1")
        if not 1 <= self.start_batch <= self.max_batch:
            raise ValueError("start_batch must be between 1 and max_batch")

    def step_time(self, batch: int) -> float:
        return self.a + self.b * batch if self.mode == "plain" else self.c + self.d * batch

    def throughput(self, batch: int) -> float:
        """Output tokens per second with `batch` requests always running (the analytic curve)."""
        step = self.step_time(batch)
        per_step = batch if self.mode == "plain" else batch * self.tau
        return per_step / step if step > 0 else math.inf

    def true_crossover(self) -> float | None:
        """Batch size where speculation stops paying, or None if it always (or never) pays."""
        num, den = self.tau * self.a - self.c, self.d - self.tau * self.b
        if num <= 0 or den <= 0:
            return None
        return num / den


@dataclass
class _Seq:
    writer: asyncio.StreamWriter
    api: str
    output_len: int
    prompt_tokens: int
    rid: str
    model: str
    include_usage: bool
    continuous_usage: bool
    done: asyncio.Future[None]
    produced: int = 0
    verify_ct: int = 0
    text_len: int = 0
    reader: asyncio.StreamReader | None = None  # to see a client that hung up (EOF) while its request waits
    cached: int = 0  # prompt tokens the llama.cpp flavour's cache served


@dataclass
class _Stats:
    accepted_tokens: int = 0
    verify_steps: int = 0
    requests: int = 0  # generate requests accepted
    generation_connections: int = 0  # connections that carried at least one generate request
    in_flight: int = 0  # accepted and not yet finished (waiting or running)
    max_in_flight: int = 0
    max_step_batch: int = 0  # the largest batch one step served
    started: float = field(default_factory=time.monotonic)
    # llama.cpp-flavour counters, moved when a request is released (as llama-server's /metrics)
    released_tokens: int = 0
    released_prompt: int = 0
    released_cached: int = 0
    released_drafts: int = 0  # verify steps that had a draft
    released_draft_tokens: int = 0
    released_accepted: int = 0
    any_spec_release: bool = False


FLAVOURS = ("sglang", "llamacpp")


class SimServer:
    def __init__(
        self,
        model: SimModel,
        model_name: str = "sim-model",
        flavour: str = "sglang",
        metrics: bool = True,
        tp_size: int = 1,
        version: str = "sim",
        write_stall_s: float = WRITE_STALL_S,
    ) -> None:
        if flavour not in FLAVOURS:
            raise ValueError(f"flavour {flavour!r} must be one of {', '.join(FLAVOURS)}")
        self.model = model
        self.model_name = model_name
        self.flavour = flavour
        self.metrics = metrics  # llama.cpp flavour: /metrics on (llama-server --metrics)
        self.tp_size = tp_size  # reported in server_info only (the all-reduce backend a bench record names)
        self.version = version
        self.write_stall_s = write_stall_s
        self._seen_prompts: set[str] = set()
        self._carrying: set[int] = set()  # open connections (by id) that carried a generate request
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._wake = asyncio.Event()
        self._rng = random.Random(model.seed)
        self._stats = _Stats()
        self._server: asyncio.AbstractServer | None = None
        self._engine: asyncio.Task[None] | None = None
        self._ids = 0
        self.steps = 0
        # Drawn at each start, as SGLang draws its random_seed without --random-seed: two starts tell apart
        self.random_seed = random.SystemRandom().randrange(1 << 30)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server = await asyncio.start_server(self._handle, host, port, backlog=4096)
        self._engine = asyncio.ensure_future(self._run_engine())
        sock = self._server.sockets[0]
        return int(sock.getsockname()[1])

    async def close(self) -> None:
        if self._engine is not None:
            await stop([self._engine])
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    # -- the engine ---------------------------------------------------------------------------------------------
    async def _run_engine(self) -> None:
        loop = asyncio.get_running_loop()
        next_start: float | None = None
        while True:
            # --start-batch: no step until that many requests are in flight at once, so a client that sends them
            # one after another never gets an answer (its request timeout says so) and a concurrent one passes;
            # requests whose client hung up do not count
            gone = [s for s in self._waiting if s.writer.is_closing() or (s.reader is not None and s.reader.at_eof())]
            for seq in gone:
                self._waiting.remove(seq)
                if not seq.done.done():
                    seq.done.set_result(None)
            if len(self._waiting) >= self.model.start_batch:
                break
            self._wake.clear()
            await self._wake.wait()
        while True:
            if not self._waiting and not self._running:
                self._wake.clear()
                await self._wake.wait()
                next_start = None
            now = loop.time()
            start = (
                now if next_start is None or now - next_start > self.model.step_time(len(self._running)) else next_start
            )
            grace = min(self.model.admit_grace, self.model.step_time(1) / 2)
            if grace > 0:
                # closed-loop clients resubmit right after their last chunk: let them join this step, as a
                # scheduler does that forms the batch after reading its queue, so the batch stays at C
                await asyncio.sleep(max(0.0, start + grace - loop.time()))
            while self._waiting and len(self._running) < self.model.max_batch:
                self._running.append(self._waiting.popleft())
            end = start + self.model.step_time(len(self._running))
            await asyncio.sleep(max(0.0, end - loop.time()))
            next_start = end
            self._step()
            await self._drain()

    def _step(self) -> None:
        self.steps += 1
        self._stats.max_step_batch = max(self._stats.max_step_batch, len(self._running))
        spec = self.model.mode == "spec"
        base, frac = int(self.model.tau), self.model.tau - int(self.model.tau)
        stamp = time.monotonic()
        still: list[_Seq] = []
        for seq in self._running:
            if seq.writer.is_closing():
                if not seq.done.done():
                    seq.done.set_result(None)
                continue
            llama_first = self.flavour == "llamacpp" and seq.produced == 0  # llama.cpp: the prompt pass's token
            verify = spec and not llama_first
            n = base + (1 if self._rng.random() < frac else 0) if verify else 1
            n = min(n, seq.output_len - seq.produced)
            seq.produced += n
            if verify:
                seq.verify_ct += 1
                self._stats.verify_steps += 1
                self._stats.accepted_tokens += n
            finished = seq.produced >= seq.output_len
            if self.flavour == "llamacpp":
                for _ in range(n):  # one event per token, in bursts
                    seq.writer.write(_frame(self._llama_token_event(seq)))
            else:
                seq.writer.write(_frame(self._event(seq, n, finished, stamp)))
            if finished:
                self._finish(seq)
            else:
                still.append(seq)
        self._running = still

    async def _drain(self) -> None:
        full = [
            seq
            for seq in self._running
            if not seq.writer.transport.is_closing()
            and seq.writer.transport.get_write_buffer_size() > _WRITE_HIGH_WATER
        ]
        if full:
            await asyncio.gather(*(self._drain_one(seq) for seq in full))
        elif not self._running:
            await asyncio.sleep(0)

    async def _drain_one(self, seq: _Seq) -> None:
        # The engine waits for slow readers (back-pressure), but a bounded time: one client that stopped reading
        # with its connection open would otherwise stop every other request. _step releases it at its next step.
        try:
            await within(seq.writer.drain(), self.write_stall_s)
        except ConnectionError:
            pass
        except asyncio.TimeoutError:
            seq.writer.transport.abort()

    def _event(self, seq: _Seq, n: int, finished: bool, stamp: float) -> dict[str, object]:
        piece = " tok" * n
        seq.text_len += len(piece)
        reason = "length" if finished else None
        if seq.api == "sglang":
            meta: dict[str, object] = {
                "id": seq.rid,
                "prompt_tokens": seq.prompt_tokens,
                "completion_tokens": seq.produced,
                "finish_reason": {"type": "length", "length": seq.output_len} if finished else None,
            }
            if self.model.mode == "spec":
                meta["spec_verify_ct"] = seq.verify_ct
            return {"text": " tok" * seq.produced, "meta_info": meta, "index": 0, "sim_ts": stamp}
        if seq.api == "chat":
            choice: dict[str, object] = {"index": 0, "delta": {"content": piece}, "finish_reason": reason}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": reason}
            obj = "text_completion"
        event: dict[str, object] = {"id": seq.rid, "object": obj, "model": seq.model, "choices": [choice]}
        event["usage"] = self._usage(seq) if seq.continuous_usage else None
        event["sim_ts"] = stamp
        return event

    def _usage(self, seq: _Seq) -> dict[str, int]:
        return {
            "prompt_tokens": seq.prompt_tokens,
            "completion_tokens": seq.produced,
            "total_tokens": seq.prompt_tokens + seq.produced,
        }

    def _llama_token_event(self, seq: _Seq) -> dict[str, object]:
        seq.text_len += 4
        head: dict[str, object] = {"id": seq.rid, "created": 0, "model": seq.model, "system_fingerprint": "b1-sim"}
        if seq.api == "chat":
            choice: dict[str, object] = {"finish_reason": None, "index": 0, "delta": {"content": " tok"}}
            return {**head, "object": "chat.completion.chunk", "choices": [choice]}
        choice = {"text": " tok", "index": 0, "logprobs": None, "finish_reason": None}
        return {**head, "object": "text_completion", "choices": [choice]}

    def _llama_final(self, seq: _Seq) -> list[dict[str, object]]:
        spec = self.model.mode == "spec"
        usage: dict[str, object] = {
            "completion_tokens": seq.produced,
            "prompt_tokens": seq.prompt_tokens,
            "total_tokens": seq.prompt_tokens + seq.produced,
            "prompt_tokens_details": {"cached_tokens": seq.cached},
        }
        timings: dict[str, object] = {
            "cache_n": seq.cached,
            "prompt_n": seq.prompt_tokens - seq.cached,
            "prompt_ms": 1.0,
            "predicted_n": seq.produced,
            "predicted_ms": 10.0,
        }
        if spec and seq.verify_ct:
            timings["draft_n"] = seq.verify_ct * self.model.num_steps
            timings["draft_n_accepted"] = seq.produced - 1 - seq.verify_ct
        head: dict[str, object] = {"id": seq.rid, "created": 0, "model": seq.model, "system_fingerprint": "b1-sim"}
        if seq.api == "chat":
            finish = {"finish_reason": "length", "index": 0, "delta": {}}
            events: list[dict[str, object]] = [{**head, "object": "chat.completion.chunk", "choices": [finish]}]
            if seq.include_usage:
                events.append(
                    {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage, "timings": timings}
                )
            return events
        choice = {"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}
        return [{**head, "object": "text_completion", "choices": [choice], "usage": usage, "timings": timings}]

    def _llama_release(self, seq: _Seq) -> None:
        stats = self._stats
        stats.released_tokens += seq.produced
        stats.released_prompt += seq.prompt_tokens - seq.cached
        stats.released_cached += seq.cached
        if self.model.mode == "spec" and seq.verify_ct:
            stats.released_drafts += seq.verify_ct
            stats.released_draft_tokens += seq.verify_ct * self.model.num_steps
            stats.released_accepted += seq.produced - 1 - seq.verify_ct
            stats.any_spec_release = True

    def _finish(self, seq: _Seq) -> None:
        if self.flavour != "llamacpp":
            self._stats.released_tokens += seq.produced  # sglang:generation_tokens_total moves at release
        if self.flavour == "llamacpp":
            for event in self._llama_final(seq):
                seq.writer.write(_frame(event))
            self._llama_release(seq)
        elif seq.api != "sglang" and seq.include_usage:
            obj = "chat.completion.chunk" if seq.api == "chat" else "text_completion"
            final = {"id": seq.rid, "object": obj, "model": seq.model, "choices": [], "usage": self._usage(seq)}
            seq.writer.write(_frame(final))
        seq.writer.write(_frame_raw(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        if not seq.done.done():
            seq.done.set_result(None)

    # -- HTTP -----------------------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request_line = await reader.readline()
                if not request_line:
                    break
                headers: dict[str, str] = {}
                while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                parts = request_line.decode("latin-1").split()
                if len(parts) < 2:
                    _respond(writer, 400, {"error": "bad request line"})
                    break
                await self._route(parts[0], parts[1].split("?", 1)[0], body, writer, reader)
                if headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._carrying.discard(id(writer))
            writer.close()

    async def _route(
        self,
        method: str,
        path: str,
        body: bytes,
        writer: asyncio.StreamWriter,
        reader: asyncio.StreamReader | None = None,
    ) -> None:
        llama = self.flavour == "llamacpp"
        if method == "GET" and path in ("/health", "/health_generate"):
            _respond(writer, 200, None)
        elif llama and method == "GET" and path == "/props":
            _respond(writer, 200, self._props())
        elif llama and method == "GET" and path == "/slots":
            _respond(writer, 200, self._slots())
        elif llama and method == "GET" and path == "/metrics" and self.metrics:
            _respond(writer, 200, self._metrics(), content_type="text/plain; version=0.0.4")
        elif not llama and method == "GET" and path == "/metrics":
            _respond(writer, 200, self._sglang_metrics(), content_type="text/plain; version=0.0.4")
        elif llama and method == "GET" and path == "/metrics":  # llama-server without --metrics
            _respond(writer, 501, {"error": {"code": 501, "message": "This server does not support metrics endpoint."}})
        elif llama and path in ("/get_server_info", "/server_info", "/generate"):
            _respond(writer, 404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})
        elif method == "GET" and path in ("/get_server_info", "/server_info"):
            _respond(writer, 200, self._server_info())
        elif method == "GET" and path == "/v1/models":
            _respond(writer, 200, {"object": "list", "data": [{"id": self.model_name, "object": "model"}]})
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions", "/generate"):
            await self._generate(path, body, writer, reader)
        else:
            _respond(writer, 404, {"error": {"message": f"no route {method} {path}"}})

    def _props(self) -> dict[str, object]:
        return {
            "default_generation_settings": {"params": {"speculative.types": "none"}, "n_ctx": 512},
            "total_slots": self.model.max_batch,
            "model_alias": self.model_name,
            "model_path": f"/models/{self.model_name}.gguf",
            "build_info": "b1-sim",
            "endpoint_slots": True,
            "endpoint_metrics": True,
        }

    def _slots(self) -> list[dict[str, object]]:
        spec = self.model.mode == "spec"
        types = "none,draft-simple" if spec else "none"
        return [
            {"id": i, "n_ctx": 512, "speculative": spec, "is_processing": False, "params": {"speculative.types": types}}
            for i in range(min(self.model.max_batch, 4))
        ]

    def _sglang_metrics(self) -> str:
        """SGLang's (--enable-metrics) released-token counter, under its own name: moved when a request is released,
        as SGLang 0.5.16's `observe_one_finished_request` does."""
        name = "sglang:generation_tokens_total"
        return f"# HELP {name} Number of generation tokens processed.\n# TYPE {name} counter\n" + (
            f'{name}{{model_name="sim-model"}} {self._stats.released_tokens}\n'
        )

    def _metrics(self) -> str:
        s = self._stats
        counters = {
            "prompt_tokens_total": s.released_prompt,
            "prompt_tokens_cached_total": s.released_cached,
            "tokens_predicted_total": s.released_tokens,
            "n_decode_total": self.steps,
            "spec_decode_num_draft_tokens_total": s.released_draft_tokens,
            "spec_decode_num_accepted_tokens_total": s.released_accepted,
            "spec_decode_num_drafts_total": s.released_drafts,
        }
        lines: list[str] = []
        for kind, items in (("counter", counters), ("gauge", {"requests_processing": s.in_flight})):
            for name, value in items.items():
                lines += [
                    f"# HELP llamacpp:{name} {name}",
                    f"# TYPE llamacpp:{name} {kind}",
                    f"llamacpp:{name} {value}",
                ]
        if s.any_spec_release:
            name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
            lines += [f"# HELP {name} Accepted tokens per draft position", f"# TYPE {name} counter"]
            lines += [f'{name}{{position="{i}"}} 0' for i in range(self.model.num_steps)]
        return "\n".join(lines) + "\n"

    def _server_info(self) -> dict[str, object]:
        spec = self.model.mode == "spec"
        accept = self._stats.accepted_tokens / self._stats.verify_steps if self._stats.verify_steps else None
        return {
            "model_path": self.model_name,
            "version": self.version,
            "tp_size": self.tp_size,
            "speculative_algorithm": "EAGLE3" if spec else None,
            "speculative_num_steps": self.model.num_steps if spec else None,
            "speculative_eagle_topk": 1 if spec else None,
            "speculative_num_draft_tokens": self.model.num_steps + 1 if spec else None,
            "max_running_requests": self.model.max_batch,
            "random_seed": self.random_seed,
            "sim_model": {k: getattr(self.model, k) for k in ("mode", "a", "b", "c", "d", "tau", "max_batch")},
            "sim_stats": {  # counts, not clocks: what the client did, as the server saw it
                "requests": self._stats.requests,
                "generation_connections": self._stats.generation_connections,
                "in_flight": self._stats.in_flight,
                "max_in_flight": self._stats.max_in_flight,
                "max_step_batch": self._stats.max_step_batch,
                "steps": self.steps,
            },
            "internal_states": [{"avg_spec_accept_length": accept, "last_gen_throughput": 0.0}],
        }

    async def _generate(
        self, path: str, body: bytes, writer: asyncio.StreamWriter, reader: asyncio.StreamReader | None = None
    ) -> None:
        try:
            req = json.loads(body)
            if not isinstance(req, dict):
                raise ValueError("body is not an object")
        except ValueError as exc:
            _respond(writer, 400, {"error": {"message": f"bad JSON: {exc}"}})
            return
        if not req.get("stream"):
            _respond(writer, 400, {"error": {"message": "the simulator only streams: set stream to true"}})
            return
        if path == "/generate" and "cache_prompt" in req:  # SGLang's /generate refuses keys it does not know
            _respond(writer, 400, {"error": {"message": "unknown field: cache_prompt"}})
            return
        if path == "/generate":
            api = "sglang"
            params = req.get("sampling_params") or {}
            output_len = params.get("max_new_tokens", 128) if isinstance(params, dict) else 128
            prompt = req.get("text", "")
        else:
            api = "chat" if path.endswith("chat/completions") else "completions"
            output_len = req.get("max_completion_tokens") or req.get("max_tokens") or 128
            prompt = req.get("prompt", "") if api == "completions" else json.dumps(req.get("messages", ""))
        options = req.get("stream_options") or {}
        if not isinstance(output_len, int) or output_len < 1:
            _respond(writer, 400, {"error": {"message": f"bad output length {output_len!r}"}})
            return
        self._ids += 1
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        seq = _Seq(
            writer=writer,
            api=api,
            output_len=output_len,
            prompt_tokens=prompt_tokens,
            rid=f"sim-{self._ids}",
            model=str(req.get("model") or self.model_name),
            include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
            continuous_usage=bool(isinstance(options, dict) and options.get("continuous_usage_stats")),
            done=asyncio.get_running_loop().create_future(),
            reader=reader,
        )
        if self.flavour == "llamacpp":
            key = str(prompt)
            if key in self._seen_prompts and req.get("cache_prompt", True) is not False:
                seq.cached = max(prompt_tokens - 1, 0)
            self._seen_prompts.add(key)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
        )
        if api == "chat":
            role: dict[str, object] = {"id": seq.rid, "object": "chat.completion.chunk", "model": seq.model}
            content = None if self.flavour == "llamacpp" else ""
            role["choices"] = [{"index": 0, "delta": {"role": "assistant", "content": content}, "finish_reason": None}]
            writer.write(_frame(role))
        self._stats.requests += 1
        if id(writer) not in self._carrying:
            self._carrying.add(id(writer))
            self._stats.generation_connections += 1
        self._stats.in_flight += 1
        self._stats.max_in_flight = max(self._stats.max_in_flight, self._stats.in_flight)
        self._waiting.append(seq)
        self._wake.set()
        try:
            await seq.done
        finally:
            self._stats.in_flight -= 1


def _frame(event: Mapping[str, object]) -> bytes:
    return _frame_raw(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")


def _frame_raw(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _respond(writer: asyncio.StreamWriter, status: int, body: object, content_type: str = "application/json") -> None:
    payload = body.encode() if isinstance(body, str) else b"" if body is None else json.dumps(body).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 501: "Not Implemented"}.get(status, "Error")
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n"
        f"Connection: keep-alive\r\n\r\n".encode()
        + payload
    )


_ms = argtypes.real(0, 60_000, unit="of milliseconds")  # a step's modelled cost, finite (argtypes.py)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`sm120check mock-server`: this server, for trying `bench` and `crossover` without a GPU."""
    parser = subparsers.add_parser(
        "mock-server",
        help="a simulated SGLang/llama.cpp server with a known speculation crossover (no GPU)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _arguments(parser)
    parser.set_defaults(handler=lambda args: _run(parser, args))


def main(argv: list[str] | None = None) -> int:
    """`python -m sm120check.bench.simserver`, the same as `sm120check mock-server`."""
    parser = argparse.ArgumentParser(prog="sm120check mock-server", description=__doc__.split("\n\n")[0])
    _arguments(parser)
    return _run(parser, parser.parse_args(argv))


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=("plain", "spec"), default="plain")
    parser.add_argument(
        "--port", type=argtypes.whole(0, 65535), default=0, help="0 picks a free port (printed on stdout)"
    )
    parser.add_argument("--a-ms", type=_ms, default=10.0, help="plain step fixed cost (ms)")
    parser.add_argument("--b-ms", type=_ms, default=0.4, help="plain step cost per running request (ms)")
    parser.add_argument("--c-ms", type=_ms, default=13.0, help="verify step fixed cost (ms)")
    parser.add_argument("--d-ms", type=_ms, default=1.2, help="verify step cost per running request (ms)")
    parser.add_argument("--tau", type=argtypes.real(1, 64), default=2.0, help="mean accepted tokens per verify step")
    parser.add_argument("--max-batch", type=argtypes.whole(1, 1 << 16), default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--admit-grace-ms", type=_ms, default=3.0, help="batch forms this long into each step")
    parser.add_argument(
        "--start-batch",
        type=argtypes.whole(1, 1 << 16),
        default=1,
        help="first step waits until this many requests are in flight",
    )
    parser.add_argument(
        "--flavour", choices=FLAVOURS, default="sglang", help="llamacpp: a stand-in with llama.cpp's event shapes"
    )
    parser.add_argument(
        "--num-steps", type=argtypes.whole(1, 64), default=3, help="draft tokens per verify step (reported)"
    )
    parser.add_argument("--no-metrics", action="store_true", help="llamacpp flavour: /metrics answers 501")
    parser.add_argument(
        "--tp-size", type=argtypes.whole(1, 64), default=1, help="the tp_size server_info reports (nothing else)"
    )
    parser.add_argument("--version", default="sim", help="the SGLang version server_info reports (nothing else)")
    parser.add_argument(
        "--max-seconds", type=argtypes.seconds, default=3600.0, help="exit after this long (a bound, not a hang)"
    )


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    try:
        model = SimModel(
            mode=args.mode,
            a=args.a_ms / 1e3,
            b=args.b_ms / 1e3,
            c=args.c_ms / 1e3,
            d=args.d_ms / 1e3,
            tau=args.tau,
            max_batch=args.max_batch,
            seed=args.seed,
            admit_grace=args.admit_grace_ms / 1e3,
            start_batch=args.start_batch,
            num_steps=args.num_steps,
        )
    except ValueError as exc:
        parser.error(str(exc))
    return asyncio.run(
        _serve(model, args.port, args.max_seconds, args.flavour, not args.no_metrics, args.tp_size, args.version)
    )


async def _serve(
    model: SimModel,
    port: int,
    max_seconds: float,
    flavour: str = "sglang",
    metrics: bool = True,
    tp_size: int = 1,
    version: str = "sim",
) -> int:
    server = SimServer(model, flavour=flavour, metrics=metrics, tp_size=tp_size, version=version)
    bound = await server.start(port=port)
    crossover = model.true_crossover()
    print(f"listening on http://127.0.0.1:{bound} mode={model.mode} true_crossover={crossover}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(asyncio.TimeoutError):
        await within(stop.wait(), max_seconds)
    await server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
