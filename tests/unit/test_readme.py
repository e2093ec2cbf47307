"""The README's first screen answers what this is, whether it runs on the reader's box, and how to start."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _sections() -> list[str]:
    return re.findall(r"^## (.+)$", README, flags=re.MULTILINE)


def test_the_first_commands_are_the_quick_start_ci_runs() -> None:
    first_block = README.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in first_block.splitlines()]
    assert commands == ["make provision", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()


def test_status_and_requirements_come_before_the_quick_starts() -> None:
    sections = _sections()
    assert sections[:2] == ["Status", "Requirements"]
    assert [s for s in sections if s.startswith("Quick start")] == [
        "Quick start: this machine",
        "Quick start: one GPU box",
        "Quick start: a rack",
    ]
    status = README.split("## Status", 1)[1].split("## ", 1)[0]
    assert "Nothing has run on an SM120 GPU or on a PCIe multi-GPU box" in status.split("\n\n")[1]
    assert "(docs/validation/README.md)" in status


def test_requirements_name_the_driver_floor_of_the_manifest() -> None:
    stack = (ROOT / "inventory" / "group_vars" / "all" / "stack.yml").read_text(encoding="utf-8")
    floor = re.search(r'^sm120kit_driver_min: "([0-9.]+)"', stack, flags=re.MULTILINE)
    assert floor is not None
    requirements = README.split("## Requirements", 1)[1].split("## ", 1)[0]
    assert f">= {floor[1]}" in requirements and "not install drivers" in requirements
    for system in ("Debian 12", "Ubuntu 22.04", "Ubuntu 24.04", "root"):
        assert system in requirements


def test_the_gpu_box_quick_start_passes_the_full_profile() -> None:
    box = README.split("## Quick start: one GPU box", 1)[1].split("## ", 1)[0]
    assert "make provision PROFILE=full" in box


def test_every_figure_links_its_record_and_says_the_models_are_synthetic() -> None:
    measured = README.split("## Measured so far", 1)[1].split("\n\nThe long version", 1)[0]
    assert "models the tests write" in measured and "not a production model" in measured
    for bullet in re.findall(r"^- .+?(?=^- |\Z)", measured, flags=re.MULTILINE | re.DOTALL):
        assert re.search(r"\]\(docs/validation/[^)]+/README\.md\)", bullet), bullet
    assert "at every level from concurrency 1 to 256" not in README  # the 3.4 % held at C = 1, 8, 64, 256 only
    # the record's crossover moved between server starts (6.4, 13.2, 29.3): no single run stands for it
    assert "6.4, 13.2 and 29.3" in measured


def test_feature_bullets_are_one_sentence_each() -> None:
    features = README.split("## What it does", 1)[1].split("## ", 1)[0]
    for bullet in re.findall(r"^- (.+?)(?=^- |\Z)", features, flags=re.MULTILINE | re.DOTALL):
        text = " ".join(bullet.split())
        assert text.endswith(".") and text.count(". ") == 0, text
