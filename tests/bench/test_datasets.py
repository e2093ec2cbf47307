"""Dataset prompts: ShareGPT JSON and SPEED-Bench JSONL as SGLang 0.5.23 reads them, categories, seeded sampling,
and hostile files refused with file:line and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sm120check.bench.datasets import DatasetError, load_dataset, parse_categories

SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "first question"}, {"from": "gpt", "value": "answer"}]},
    {"id": "b", "conversations": []},  # empty, as in the real ShareGPT dump: skipped
    {"id": "c", "conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "second"}]},
    {"id": "d", "conversation": [{"from": "human", "value": "third"}]},  # the singular key SGLang also reads
]
# the shape of nvidia/SPEED-Bench's throughput JSONL (sglang/benchmark/datasets/speed_bench.py reads turns[0])
SPEED = [
    {"question_id": 1, "category": "low_entropy", "turns": ["sort these numbers", "and again"]},
    {"question_id": 2, "category": "high_entropy", "turns": ["write a poem"]},
    {"question_id": 3, "category": "mixed", "turns": []},  # no turns: skipped, as SGLang does
    {"question_id": 4, "category": "low_entropy", "turns": ["list the primes"]},
    {"question_id": 5, "category": "mixed", "prompt": "a prompt field works too"},
]


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_sharegpt_takes_the_first_human_turn_and_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "sg.json", json.dumps(SHAREGPT, indent=1))
    ds = load_dataset(path)
    assert ds.format == "sharegpt" and ds.skipped == 1
    assert [p.text for p in ds.prompts] == ["first question", "second", "third"]
    lines = path.read_text().splitlines()
    for p in ds.prompts:  # each prompt names the line its entry starts on
        line = int(p.where.rsplit(":", 1)[1])
        assert lines[line - 1].strip() == "{"
    assert ds.prompts[0].where == f"{path}:2"


def test_speed_bench_rows_keep_their_category_and_select_by_it(tmp_path: Path) -> None:
    path = write(tmp_path, "speed.jsonl", "\n".join(json.dumps(r) for r in SPEED) + "\n\n")
    ds = load_dataset(path)
    assert ds.format == "speed-bench" and ds.skipped == 1
    assert ds.categories() == {"low_entropy": 2, "high_entropy": 1, "mixed": 1}
    low = load_dataset(path, categories=parse_categories("low_entropy"))
    assert [p.text for p in low.prompts] == ["sort these numbers", "list the primes"]
    assert [p.where for p in low.prompts] == [f"{path}:1", f"{path}:4"]
    both = load_dataset(path, "speed-bench", parse_categories("mixed, high_entropy,mixed"))
    assert sorted(p.text for p in both.prompts) == ["a prompt field works too", "write a poem"]
    with pytest.raises(DatasetError, match=r"--category nope: not in .*high_entropy \(1\), low_entropy \(2\)"):
        load_dataset(path, categories=("nope",))
    sg = write(tmp_path, "sg.json", json.dumps(SHAREGPT))
    with pytest.raises(DatasetError, match="has no categories; drop --category"):
        load_dataset(sg, categories=("mixed",))
    with pytest.raises(DatasetError, match="names no category"):
        parse_categories(" , ")


def test_sampling_is_deterministic_per_seed_and_uses_every_prompt_before_repeating(tmp_path: Path) -> None:
    rows = [{"category": "c", "turns": [f"prompt {i}"]} for i in range(10)]
    ds = load_dataset(write(tmp_path, "d.jsonl", "\n".join(json.dumps(r) for r in rows)))
    a = [p.text for p in ds.sample(25, seed=5)]
    assert a == [p.text for p in ds.sample(25, seed=5)]
    assert a != [p.text for p in ds.sample(25, seed=6)]
    assert len(set(a[:10])) == 10 and len(set(a[10:20])) == 10  # each round holds every prompt once
    assert len({p.text for p in ds.sample(7, seed=1)}) == 7  # fewer than the file: no repeats


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("bad.json", '[\n{"conversations": []},\n{"conversations": [}\n]', r"bad.json:3:\d+: bad JSON"),
        ("arr.json", '[\n {"conversations": []}\n {"x": 1}\n]', r"arr.json:3: expected , or \]"),
        ("tail.json", "[]\n\ngarbage", r"tail.json:3: text after the closing \]"),
        ("num.json", '[\n1,\n{"conversations": []}]', r"num.json:2: a ShareGPT entry must be an object"),
        ("noconv.json", '[\n{"text": "hi"}\n]', r"noconv.json:2: entry has no \"conversations\""),
        ("turn.json", '[{"conversations": ["hi"]}]', r"turn.json:1: turn 0 must be an object"),
        ("val.json", '[{"conversations": [{"from": "human", "value": 3}]}]', r"val.json:1: turn 0 \"value\" must"),
        ("deep.json", "[" + "[" * 100_000 + "]" * 100_000 + "]", r"deep.json:1: JSON nested too deeply"),
        ("row.jsonl", '{"category": "a", "turns": ["x"]}\n{"category": "a", "turns": [1]}', r"row.jsonl:2: \"turns\""),
        ("cat.jsonl", '{"category": 5, "turns": ["x"]}', r"cat.jsonl:1: \"category\" must be a string"),
        ("nojs.jsonl", '{"category": "a", "turns": ["x"]}\n{oops', r"nojs.jsonl:2: not JSON"),
        ("list.jsonl", '{"turns": ["x"]}\n[1]', r"list.jsonl:2: a JSON list"),
        ("none.jsonl", '{"category": "a"}', r"none.jsonl:1: row has neither \"turns\""),
        ("tl.jsonl", '{"turns": "not a list"}', r"tl.jsonl:1: \"turns\" must be a list"),
        ("empty.jsonl", '{"turns": []}\n', r"holds no usable prompt \(1 entries without one\)"),
        ("plain.txt", "just a prompt per line\n", r"plain.txt: neither a JSON array .* --prompt-file"),
    ],
)
def test_hostile_files_are_refused_naming_file_line_and_the_fix(
    tmp_path: Path, name: str, text: str, words: str
) -> None:
    with pytest.raises(DatasetError, match=words):
        load_dataset(write(tmp_path, name, text))


def test_size_encoding_and_path_problems_are_refused_before_parsing(tmp_path: Path) -> None:
    big = write(tmp_path, "big.jsonl", '{"turns": ["x"]}\n' * 100)
    with pytest.raises(DatasetError, match=r"larger than 1000 bytes.*use a subset"):
        load_dataset(big, max_bytes=1000)
    latin = write(tmp_path, "latin.jsonl", b'{"turns": ["ok"]}\n{"turns": ["caf\xe9"]}\n')
    with pytest.raises(DatasetError, match=r"latin.jsonl:2: not UTF-8 .*convert the file"):
        load_dataset(latin)
    with pytest.raises(DatasetError, match="is a directory"):
        load_dataset(tmp_path)
    with pytest.raises(DatasetError, match="No such file"):
        load_dataset(tmp_path / "missing.json")
    with pytest.raises(DatasetError, match="--dataset-format 'csv'"):
        load_dataset(big, "csv")
    huge = write(tmp_path, "huge.jsonl", json.dumps({"turns": ["x" * (1 << 20 + 1)]}))
    with pytest.raises(DatasetError, match=r"huge.jsonl:1: \"turns\"\[0\] is 2097152 characters"):
        load_dataset(huge)
    # a BOM is not an error
    bom = write(tmp_path, "bom.jsonl", '\ufeff{"turns": ["fine"]}')
    assert load_dataset(bom).prompts[0].text == "fine"
