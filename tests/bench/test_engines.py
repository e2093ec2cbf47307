"""Server discovery: one ServerFacts per engine, read before any load; an unknown stays unknown."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

import pytest

from bench.conftest import SIM_ARGS, Sim
from lab.loopback import QuietHandler, serve, url
from sm120check.bench.engines import ServerFacts, discover
from sm120check.bench.http import Endpoint, HttpError


def facts_of(address: str) -> ServerFacts:
    return asyncio.run(discover(Endpoint.parse(address), {}, timeout=5.0))


@contextlib.contextmanager
def routes(answers: dict[str, tuple[int, str, bytes]]) -> Iterator[str]:
    """GET path -> (status, content type, body); anything else 404."""

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            self.send(*answers.get(self.path, (404, "application/json", b'{"error": "not found"}')))

    with serve(Handler) as server:
        yield url(server)


MODELS = (200, "application/json", b'{"object": "list", "data": [{"id": "Qwen/Qwen3-8B"}]}')


def test_sglang_facts_come_from_get_server_info(spec_sim: Sim) -> None:
    facts = facts_of(spec_sim.url)
    assert (facts.engine, facts.speculative, facts.speculative_num_steps) == ("sglang", True, 3)
    assert facts.sglang_info and facts.openai_models and facts.first_model_id == "sim-model"
    record = facts.to_record()
    assert record["speculative_algorithm"] == "EAGLE3" and record["engine"] == "sglang"


def test_llamacpp_facts_come_from_props_slots_and_metrics(sim_factory: Callable[..., Sim]) -> None:
    sim = sim_factory("spec", *SIM_ARGS, "--flavour", "llamacpp", "--num-steps", "8")
    facts = facts_of(sim.url)
    assert facts.engine == "llama.cpp" and facts.speculative is True and facts.version == "b1-sim"
    assert not facts.sglang_info and facts.openai_models and facts.has_metrics
    # the draft length shows only as per-position series, which appear once a speculative request has finished
    assert facts.speculative_num_steps is None
    assert facts.to_record()["speculative_algorithm"] == "draft-simple"


def test_a_plain_llamacpp_server_is_known_not_to_speculate(sim_factory: Callable[..., Sim]) -> None:
    facts = facts_of(sim_factory("plain", *SIM_ARGS, "--flavour", "llamacpp").url)
    assert facts.engine == "llama.cpp" and facts.speculative is False
    assert facts.to_record()["speculative_algorithm"] is None  # known off: an explicit null


def test_vllm_facts_come_from_version_and_metrics() -> None:
    metrics = b'vllm:num_requests_running{engine="0"} 0\nvllm:spec_decode_num_drafts_total{engine="0"} 5\n' + b"".join(
        b'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="%d"} 1\n' % i for i in range(3)
    )
    answers = {"/version": (200, "application/json", b'{"version": "0.11.0"}'), "/v1/models": MODELS}
    answers["/metrics"] = (200, "text/plain", metrics)
    with routes(answers) as address:
        facts = facts_of(address)
    assert (facts.engine, facts.version, facts.speculative, facts.speculative_num_steps) == ("vllm", "0.11.0", True, 3)
    assert facts.model == "Qwen/Qwen3-8B"


def test_an_unknown_server_leaves_speculation_unknown_not_off() -> None:
    with routes({"/v1/models": MODELS}) as address:
        facts = facts_of(address)
    assert facts.engine == "unknown" and facts.speculative is None and facts.speculative_num_steps is None
    record = facts.to_record()
    assert "speculative_algorithm" not in record and record["speculative"] is None


@pytest.mark.timeout(60)
def test_a_stalled_discovery_route_is_bounded_and_named() -> None:
    import threading

    release = threading.Event()

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            if self.path == "/props":
                release.wait(30)
                return
            self.send(404, "application/json", b"{}")

    with serve(Handler) as server:
        try:
            with pytest.raises(HttpError, match=r"GET http://127\.0\.0\.1:\d+/props: no complete response"):
                asyncio.run(discover(Endpoint.parse(url(server)), {}, timeout=0.5))
        finally:
            release.set()
