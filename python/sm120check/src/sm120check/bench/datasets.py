"""Prompts from a dataset file: ShareGPT JSON or SPEED-Bench-style JSONL with categories; seeded sampling.

Formats, as SGLang 0.5.23 reads them (sglang/benchmark/datasets/):
- sharegpt (`sharegpt.py`): one JSON array of {"conversations": [{"from": "human", "value": "..."}, ...]} (the key
  "conversation" too). The prompt is the first turn from "human" (or "user"); SGLang takes turn 0 of every entry
  with two turns or more, whoever spoke it. Output lengths are not taken from the file (--output-len applies).
- speed-bench (`speed_bench.py`, nvidia/SPEED-Bench's throughput JSONL): one object per line with "category" and
  "turns" (a list of strings); the prompt is turns[0], rows with no turns are skipped, `--category` keeps the rows
  of those categories. A "prompt" string instead of "turns" is read too.
Hostile files: the size is bounded before parsing (`MAX_DATASET_BYTES`), so is each prompt, and every error names
file:line and the fix. Entries without a usable prompt (an empty conversation) are skipped and counted, as SGLang
skips them; an entry of the wrong shape is an error.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sm120check import bounded

MAX_DATASET_BYTES = 1 << 30  # ShareGPT_V3_unfiltered_cleaned_split.json is about 0.67 GB
MAX_PROMPT_CHARS = 1 << 20
FORMATS = ("auto", "sharegpt", "speed-bench")
_HUMAN = ("human", "user")


class DatasetError(ValueError):
    """A dataset file that cannot be used; the message names file:line and the fix."""


@dataclass(frozen=True)
class DatasetPrompt:
    text: str
    category: str  # "" when the format has none
    where: str  # file:line the prompt came from


@dataclass(frozen=True)
class Dataset:
    path: Path
    format: str  # "sharegpt" or "speed-bench"
    prompts: tuple[DatasetPrompt, ...]
    skipped: int = 0  # entries without a usable prompt
    categories_kept: tuple[str, ...] = ()  # the --category selection, () for all

    def categories(self) -> dict[str, int]:
        """Prompts per category, in first-seen order."""
        return dict(Counter(p.category for p in self.prompts))

    def select(self, categories: Sequence[str]) -> Dataset:
        """Only the prompts of these categories; an unknown category is an error listing the known ones."""
        if not categories:
            return self
        known = self.categories()
        if self.format == "sharegpt" or set(known) == {""}:
            raise DatasetError(
                f"--category {','.join(categories)}: {self.path} ({self.format}) has no categories; drop --category "
                'or use a SPEED-Bench-style JSONL with a "category" field'
            )
        missing = [c for c in categories if c not in known]
        if missing:
            listing = ", ".join(f"{name or '(none)'} ({count})" for name, count in sorted(known.items()))
            raise DatasetError(
                f"--category {','.join(missing)}: not in {self.path}; its categories are {listing[:400]}"
            )
        kept = tuple(p for p in self.prompts if p.category in categories)
        return Dataset(self.path, self.format, kept, self.skipped, tuple(categories))

    def sample(self, n: int, seed: int = 0) -> list[DatasetPrompt]:
        """n prompts, the same for the same seed: without repeats while the file has enough, then every prompt
        once per round (each round shuffled) so no prompt repeats before all have been used."""
        if n < 0:
            raise ValueError(f"cannot sample {n} prompts")
        if not self.prompts:
            raise DatasetError(f"{self.path} has no prompts to sample")
        rng = random.Random(seed)
        if n <= len(self.prompts):
            return rng.sample(self.prompts, n)
        out: list[DatasetPrompt] = []
        while len(out) < n:
            round_ = list(self.prompts)
            rng.shuffle(round_)
            out.extend(round_[: n - len(out)])
        return out


def parse_categories(text: str) -> tuple[str, ...]:
    """`--category a,b`: names, each once, in the order given."""
    out: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if part and part not in out:
            out.append(part)
    if not out:
        raise DatasetError(f"--category {text!r} names no category (e.g. --category low_entropy,mixed)")
    return tuple(out)


def load_dataset(
    path: Path,
    fmt: str = "auto",
    categories: Sequence[str] = (),
    max_bytes: int = MAX_DATASET_BYTES,
) -> Dataset:
    """Read and check a dataset file; raises DatasetError naming file:line and the fix."""
    if fmt not in FORMATS:
        raise DatasetError(f"--dataset-format {fmt!r}: give one of {', '.join(FORMATS)}")
    try:
        text = bounded.read_text(path, max_bytes)
    except bounded.TooLarge as exc:
        raise DatasetError(f"--dataset {exc}, read into memory; use a subset of it (e.g. the first entries)") from None
    except bounded.NotText as exc:
        raise DatasetError(f"--dataset {exc}") from None
    except bounded.Unreadable as exc:
        raise DatasetError(f"--dataset {exc}; give the JSON or JSONL file") from None
    if fmt == "auto":
        head = text.lstrip()[:1]
        if head == "[":
            fmt = "sharegpt"
        elif head == "{":
            fmt = "speed-bench"
        else:
            raise DatasetError(
                f"{path}: neither a JSON array (ShareGPT) nor JSON lines (SPEED-Bench); give --dataset-format, or "
                "use --prompt-file for plain text, one prompt per line"
            )
    dataset = _sharegpt(path, text) if fmt == "sharegpt" else _speed_bench(path, text)
    if not dataset.prompts:
        raise DatasetError(f"{path} holds no usable prompt ({dataset.skipped} entries without one); check the format")
    return dataset.select(tuple(categories))


def _check_prompt(text: object, where: str, field: str) -> str:
    if not isinstance(text, str):
        raise DatasetError(f"{where}: {field} must be a string, not {type(text).__name__}; fix or remove the entry")
    if len(text) > MAX_PROMPT_CHARS:
        raise DatasetError(
            f"{where}: {field} is {len(text)} characters, above the bound of {MAX_PROMPT_CHARS}; shorten or remove it"
        )
    return text


def _sharegpt(path: Path, text: str) -> Dataset:
    prompts: list[DatasetPrompt] = []
    skipped = 0
    for line, entry in _array_items(path, text):
        where = f"{path}:{line}"
        if not isinstance(entry, dict):
            kind = type(entry).__name__
            raise DatasetError(f'{where}: a ShareGPT entry must be an object with "conversations", not a {kind}')
        turns = entry.get("conversations", entry.get("conversation"))
        if turns is None:
            raise DatasetError(
                f'{where}: entry has no "conversations" list; ShareGPT entries look like '
                '{"conversations": [{"from": "human", "value": "..."}]}'
            )
        if not isinstance(turns, list):
            raise DatasetError(f'{where}: "conversations" must be a list of turns, not {type(turns).__name__}')
        prompt: str | None = None
        for number, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise DatasetError(f'{where}: turn {number} must be an object with "from" and "value"')
            if turn.get("from") in _HUMAN:
                prompt = _check_prompt(turn.get("value"), where, f'turn {number} "value"')
                break
        if not prompt or not prompt.strip():
            skipped += 1
            continue
        prompts.append(DatasetPrompt(prompt, "", where))
    return Dataset(path, "sharegpt", tuple(prompts), skipped)


def _array_items(path: Path, text: str) -> Iterable[tuple[int, object]]:
    """The elements of a top-level JSON array with the line each starts on."""
    decoder = json.JSONDecoder()
    pos = _skip_ws(text, 0)
    if text[pos : pos + 1] != "[":
        raise DatasetError(f"{path}:1: a ShareGPT file is one JSON array ([{{...}}, ...])")
    pos, line, counted = pos + 1, 1, 0
    first = True
    while True:
        pos = _skip_ws(text, pos)
        line += text.count("\n", counted, pos)
        counted = pos
        if text[pos : pos + 1] == "]":
            rest = _skip_ws(text, pos + 1)
            if rest != len(text):
                raise DatasetError(f"{path}:{line + text.count(chr(10), pos, rest)}: text after the closing ]")
            return
        if not first:
            if text[pos : pos + 1] != ",":
                raise DatasetError(f"{path}:{line}: expected , or ] between entries; the JSON array is broken")
            pos = _skip_ws(text, pos + 1)
            line += text.count("\n", counted, pos)
            counted = pos
        try:
            value, end = decoder.raw_decode(text, pos)
        except RecursionError:
            raise DatasetError(f"{path}:{line}: JSON nested too deeply to be a ShareGPT entry") from None
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{exc.lineno}:{exc.colno}: bad JSON ({exc.msg}); fix the file") from None
        except ValueError as exc:  # an integer over Python's 4300-digit limit
            raise DatasetError(f"{path}:{line}: bad JSON ({exc}); fix the file") from None
        yield line, value
        first = False
        pos = end


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _speed_bench(path: Path, text: str) -> Dataset:
    prompts: list[DatasetPrompt] = []
    skipped = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except RecursionError:
            raise DatasetError(f"{where}: JSON nested too deeply to be a dataset row") from None
        except ValueError as exc:
            raise DatasetError(
                f'{where}: not JSON ({exc}); each line must be one object like {{"category": "...", "turns": [...]}}'
            ) from None
        if not isinstance(row, dict):
            raise DatasetError(f'{where}: a JSON {type(row).__name__}, not an object with "category" and "turns"')
        category = row.get("category", "")
        if category is None:
            category = ""
        if not isinstance(category, str):
            raise DatasetError(f'{where}: "category" must be a string, not {type(category).__name__}')
        if "turns" in row:
            turns = row["turns"]
            if not isinstance(turns, list):
                raise DatasetError(f'{where}: "turns" must be a list of strings, not {type(turns).__name__}')
            if not turns:
                skipped += 1
                continue
            prompt = _check_prompt(turns[0], where, '"turns"[0]')
        elif "prompt" in row:
            prompt = _check_prompt(row["prompt"], where, '"prompt"')
        else:
            raise DatasetError(f'{where}: row has neither "turns" (a list of strings) nor "prompt" (a string)')
        if not prompt.strip():
            skipped += 1
            continue
        prompts.append(DatasetPrompt(prompt, category, where))
    return Dataset(path, "speed-bench", tuple(prompts), skipped)
