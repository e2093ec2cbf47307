"""When a "speculative" run is not one: a server that runs speculation but accepts (almost) none of its draft's
tokens at concurrency 1 is a misconfigured draft (a draft for another target, a wrong draft path, a vocabulary
mismatch: sglang#21272), and its numbers are a slower base server's, not speculation's."""

from __future__ import annotations

MIN_ACCEPT_LENGTH = 1.05  # tokens per verify step, bonus token included; 1.0 is "every draft token rejected"
FLAG = "draft_not_accepted"


def draft_problem(concurrency: int, speculative: bool | None, accept_length: float | None) -> str:
    """Why the level at concurrency 1 cannot count as speculative ("" when it can, or when it is not that level)."""
    if concurrency != 1 or speculative is not True or accept_length is None or accept_length > MIN_ACCEPT_LENGTH:
        return ""
    return (
        f"the server runs speculation but accepts {accept_length:.3f} tokens per verify step at concurrency 1 "
        f"(<= {MIN_ACCEPT_LENGTH}): its draft's tokens are almost never accepted, so this is not a speculative run "
        "(a misconfigured draft, sglang#21272: check that --speculative-draft-model-path is the EAGLE-3 draft "
        "trained for this target and shares its vocabulary); `crossover` refuses it as the speculative sweep"
    )
