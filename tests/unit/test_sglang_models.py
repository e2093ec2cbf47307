"""tests/lab/sglang_models.py: the files SGLang reads, and a torch mirror of SGLang's forward over them (CPU, seconds).

The reference forward (lab.sglang_models.reference_target / reference_draft) follows SGLang 0.5.16's LlamaForCausalLM
and LlamaForCausalLMEagle3 (see that module's docstring for the functions read); here it runs on weights read back
from the written safetensors.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lab.sglang_models import (
    BOS_ID,
    CHAT_TEMPLATE,
    EOS_ID,
    N_SPECIAL,
    UNK_ID,
    Emu,
    ModelSpec,
    check_pair,
    draft_chains,
    exact_accept_length,
    expected_accept_length,
    load_weights,
    main,
    reference_draft,
    reference_target,
    token_maps,
    write_pair,
)

TINY = ModelSpec(layers=7, hidden=256, intermediate=128, vocab=256, heads=4, kv_heads=2, dtype="float32", seed=3)
STEPS = 3


def _quiet(_: str) -> None:
    pass


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny matmuls: torch's thread pool costs 50x the work on a loaded two-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    write_pair(TINY, out, log=_quiet)
    return out


def _greedy(wts: dict[str, torch.Tensor], spec: ModelSpec, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        seq = torch.tensor(ids)
        logits, _ = reference_target(wts, spec, seq, torch.arange(len(ids)), Emu())
        ids.append(int(logits[-1].argmax()))
    return ids[len(prompt) :]


def test_target_greedy_iterates_f(tiny: Path) -> None:
    wts = load_weights(tiny / "target")
    f = token_maps(TINY).f
    for prompt in ([BOS_ID, 10, 20, 30], [BOS_ID], [UNK_ID, 200, 7], [5, 5, 5, EOS_ID], [BOS_ID, *range(3, 40)]):
        want, tok = [], prompt[-1]
        for _ in range(6):
            tok = f[tok]
            want.append(tok)
        got = _greedy(wts, TINY, prompt, 6)
        assert got == want, prompt
        assert all(t >= N_SPECIAL for t in got)  # never a special token


def test_draft_chain_equals_target_for_every_start(tiny: Path) -> None:
    target, draft = load_weights(tiny / "target"), load_weights(tiny / "draft")
    f = token_maps(TINY).f
    nxt, props = draft_chains(target, draft, TINY, STEPS, Emu())
    assert nxt.tolist() == f
    for s in range(TINY.vocab):
        want, tok = [], f[s]  # the target emitted f(s) after s; the draft proposes the tokens after it
        for _ in range(STEPS):
            tok = f[tok]
            want.append(tok)
        assert props[s].tolist() == want, s


def test_draft_over_a_sequence_matches_the_one_token_rows(tiny: Path) -> None:
    """Draft extend as SGLang runs it: input ids shifted by one, the target's aux at each position, real positions."""
    target, draft = load_weights(tiny / "target"), load_weights(tiny / "draft")
    f = token_maps(TINY).f
    seq = [BOS_ID, 9]
    while len(seq) < 40:
        seq.append(f[seq[-1]])
    ids, pos = torch.tensor(seq), torch.arange(len(seq))
    logits, aux = reference_target(target, TINY, ids, pos, Emu())
    assert logits.argmax(dim=-1)[1:].tolist() == [*seq[2:], f[seq[-1]]]
    shifted = torch.tensor([*seq[1:], f[seq[-1]]])
    dl, daux = reference_draft(draft, TINY, shifted, aux, pos, Emu(), target["model.embed_tokens.weight"])
    # the draft reads the target's aux (e of the token at t), not its input id: it proposes f(f(x_t)) = x_{t+2}
    assert dl.argmax(dim=-1).tolist() == [f[f[t]] for t in seq]
    # the next draft step, fed the draft's own H-wide output (fc skipped)
    dl2, _ = reference_draft(draft, TINY, dl.argmax(dim=-1), daux, pos + 1, Emu(), target["model.embed_tokens.weight"])
    assert dl2.argmax(dim=-1).tolist() == [f[f[f[t]]] for t in seq]


def _measured_accept_length(props: torch.Tensor, f: list[int], start: int, rounds: int) -> float:
    """SGLang's loop with topk 1: the draft proposes from the previous token's row, the target accepts the prefix."""
    traj = [start]
    while len(traj) < rounds * (STEPS + 1) + STEPS + 2:
        traj.append(f[traj[-1]])
    p, total = 1, 0  # traj[0] is the prompt's last token, traj[1] the target's first (bonus) token
    for _ in range(rounds):
        proposed = props[traj[p - 1]].tolist()
        accepted = 0
        while accepted < STEPS and proposed[accepted] == traj[p + 1 + accepted]:
            accepted += 1
        total += accepted + 1
        p += accepted + 1
    return total / rounds


@pytest.mark.parametrize("p", [0.0, 0.1, 0.3, 0.6])
def test_measured_acceptance_matches_the_formula(tmp_path: Path, p: float) -> None:
    spec = ModelSpec(layers=4, hidden=256, intermediate=64, vocab=1024, heads=4, kv_heads=4, dtype="float32")
    spec = dataclasses.replace(spec, draft_error=p)
    write_pair(spec, tmp_path, log=_quiet)
    target, draft = load_weights(tmp_path / "target"), load_weights(tmp_path / "draft")
    maps = token_maps(spec)
    _, props = draft_chains(target, draft, spec, STEPS, Emu())
    # the draft's state never derails: its k-th proposal is sigma(the target's k-th token)
    for s in range(N_SPECIAL, spec.vocab):
        tok, want = maps.f[s], []
        for _ in range(STEPS):
            tok = maps.f[tok]
            want.append(maps.sigma[tok])
        assert props[s].tolist() == want
    measured = sum(_measured_accept_length(props, maps.f, start, 300) for start in (3, 500, 900)) / 3
    exact = exact_accept_length(spec.regular, len(maps.error_set), STEPS)
    assert measured == pytest.approx(exact, rel=0.05)
    assert exact == pytest.approx(expected_accept_length(p, STEPS), rel=0.01)
    if p == 0.0:
        assert measured == STEPS + 1


def test_tokenizer(tiny: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny / "target" / "tokenizer.json"))
    enc = tok.encode("w1 w2 w3", add_special_tokens=False)
    assert enc.ids == [N_SPECIAL + 1, N_SPECIAL + 2, N_SPECIAL + 3]
    assert tok.decode(enc.ids) == "w1 w2 w3"
    spelled = tok.encode("<s> w1 nonsense", add_special_tokens=False)
    assert spelled.ids[:2] == [BOS_ID, N_SPECIAL + 1] and UNK_ID not in spelled.ids and len(spelled.ids) == 2 + 8
    assert tok.decode(spelled.ids) == "w1 nonsense"
    # The bench's prompts (a unique tag first): distinct text, distinct ids, no <unk> (the server's prefix cache
    # answered 95 % of every prompt on the H200 when all of them were <unk>)
    one, two = (tok.encode(f"[r1 C8 #{i}] The operators of a cluster", add_special_tokens=False).ids for i in (3, 4))
    assert one != two and UNK_ID not in one + two
    cfg = json.loads((tiny / "target" / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == CHAT_TEMPLATE
    assert tok.token_to_id(cfg["bos_token"]) == BOS_ID and tok.token_to_id(cfg["eos_token"]) == EOS_ID
    assert tok.decode([BOS_ID, N_SPECIAL + 7, EOS_ID]) == "w7"  # specials skipped
    # The chat template as transformers renders it (a sandboxed jinja2 environment, trim_blocks and lstrip_blocks).
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    messages = [{"role": "system", "content": "w5"}, {"role": "user", "content": "w1 w2 w3"}]
    text = env.from_string(CHAT_TEMPLATE).render(messages=messages, bos_token="<s>", add_generation_prompt=True)
    assert text == "<s>w5 w1 w2 w3"
    w = [N_SPECIAL + k for k in (5, 1, 2, 3)]
    assert tok.encode(text, add_special_tokens=False).ids == [BOS_ID, *w]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed here")
def test_tokenizer_loads_with_transformers(tiny: Path) -> None:
    from transformers import AutoTokenizer  # type: ignore[import-not-found]

    tok = AutoTokenizer.from_pretrained(str(tiny / "target"))
    assert tok.bos_token_id == BOS_ID and tok.eos_token_id == EOS_ID
    assert tok.decode(tok("w1 w2 w3", add_special_tokens=False)["input_ids"]) == "w1 w2 w3"
    text = tok.apply_chat_template([{"role": "user", "content": "w1 w2"}], tokenize=False, add_generation_prompt=True)
    assert text == "<s>w1 w2"


def test_configs_carry_what_sglang_reads(tiny: Path) -> None:
    t = json.loads((tiny / "target" / "config.json").read_text())
    d = json.loads((tiny / "draft" / "config.json").read_text())
    common = {
        "hidden_size": TINY.hidden,
        "num_attention_heads": TINY.heads,
        "num_key_value_heads": TINY.kv_heads,
        "head_dim": TINY.head_dim,
        "vocab_size": TINY.vocab,
        "rms_norm_eps": TINY.rms_norm_eps,
        "rope_theta": TINY.rope_theta,
        "max_position_embeddings": TINY.max_position_embeddings,
        "torch_dtype": "float32",
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "model_type": "llama",
    }
    for cfg in (t, d):
        assert {k: cfg[k] for k in common} == common
    assert t["architectures"] == ["LlamaForCausalLM"]
    assert (t["num_hidden_layers"], t["intermediate_size"]) == (TINY.layers, TINY.intermediate)
    assert d["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (d["num_hidden_layers"], d["intermediate_size"]) == (1, TINY.vocab)
    assert d["draft_vocab_size"] == TINY.vocab  # not None: SGLang keeps the draft's own lm_head
    assert d["target_hidden_size"] == TINY.hidden
    ids = d["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    # SGLang captures before layer id + 1; 7 layers: the default capture points [2, L // 2, L - 3]
    assert [i + 1 for i in ids] == [2, TINY.layers // 2, TINY.layers - 3]
    assert ModelSpec(layers=32).aux_layer_ids() == [1, 15, 28]
    assert ModelSpec(layers=4).aux_layer_ids() == [0, 1, 2]
    gen = json.loads((tiny / "target" / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (BOS_ID, EOS_ID)
    # the draft's checkpoint names, as LlamaForCausalLMEagle3.load_weights maps them
    names = set(load_weights(tiny / "draft"))
    assert {"fc.weight", "lm_head.weight", "norm.weight", "midlayer.hidden_norm.weight"} <= names
    assert load_weights(tiny / "draft")["fc.weight"].shape == (TINY.hidden, 3 * TINY.hidden)
    assert load_weights(tiny / "draft")["midlayer.self_attn.q_proj.weight"].shape == (TINY.hidden, 2 * TINY.hidden)
    assert not any("d2t" in n or "t2d" in n for n in names)


def test_bf16_medium_every_token() -> None:
    """bf16 rounding (emulated as the GPU kernels do: bf16 operands, fp32 accumulate) leaves every argmax right."""
    spec = ModelSpec(layers=4, hidden=1024, intermediate=64, vocab=4096, heads=8, kv_heads=8, dtype="bfloat16")
    r = check_pair(spec, "cpu", log=_quiet)
    assert r["target_wrong"] == 0 and r["draft_wrong"] == 0
    assert r["target_min_margin"] > 0.5 * spec.hidden and r["draft_min_margin"] > 0.5 * spec.hidden


def test_bf16_chained_steps_from_the_files(tmp_path: Path) -> None:
    spec = ModelSpec(layers=4, hidden=512, intermediate=64, vocab=2048, heads=4, kv_heads=2, dtype="bfloat16")
    write_pair(spec, tmp_path, log=_quiet)
    target, draft = load_weights(tmp_path / "target"), load_weights(tmp_path / "draft")
    assert target["lm_head.weight"].dtype == torch.bfloat16
    f = token_maps(spec).f
    nxt, props = draft_chains(target, draft, spec, STEPS, Emu(torch.bfloat16))
    assert nxt.tolist() == f
    want = torch.tensor([[f[f[s]], f[f[f[s]]], f[f[f[f[s]]]]] for s in range(spec.vocab)])
    assert torch.equal(props, want)


def test_sharded_atomic_and_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["write", "--out", str(tmp_path), "--layers", "4", "--hidden", "128", "--intermediate", "64"]
    argv += ["--vocab", "512", "--heads", "2", "--kv-heads", "2", "--shard-gb", "0.0005"]
    assert main(argv) == 0
    assert "bytes" in capsys.readouterr().out
    index = json.loads((tmp_path / "target" / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in (tmp_path / "target").glob("*.safetensors"))
    assert len(shards) > 1 and set(index["weight_map"].values()) == set(shards)
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in load_weights(tmp_path / "target").values())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft", "target"]  # no .tmp-* left
    with pytest.raises(FileExistsError):
        main(argv)
    assert main([*argv, "--force", "--seed", "1"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft", "target"]
