"""`sm120check sglang scan` on the real SGLang 0.5.16 wheel: the summary line first, the doctor's status words, the
EAGLE-3 model findings as counts unless --model narrows them."""

from __future__ import annotations

from lab.sglang_releases import release_dir, run_cli

ARGS = ("--cc", "12.0", "--flashinfer-version", "0.7.2")


def _scan(*extra: str) -> tuple[int, list[str]]:
    status, text = run_cli("scan", *ARGS, "--source", str(release_dir("0.5.16")), *extra)
    return status, text.splitlines()


def test_the_summary_line_comes_first() -> None:
    status, lines = _scan()
    assert status == 1
    assert lines[0] == (
        "SGLang 0.5.16 for compute capability 12.0: 33 fail, 12 warn, 3 pass (40 of them EAGLE-3 model classes); "
        "patch needed: sm120check sglang patch"
    )


def test_findings_use_the_doctors_status_words() -> None:
    _, lines = _scan()
    words = {line.split()[0] for line in lines if line.startswith("  ")}
    assert words == {"PASS", "FAIL", "WARN", "note"}


def test_eagle3_models_are_counted_unless_named() -> None:
    _, lines = _scan()
    assert (
        "  FAIL  EAGLE-3: 28 model classes lack EAGLE-3's methods; the patch delegates them (--model NAME shows one, "
        "--json all)"
    ) in lines
    assert "  WARN  EAGLE-3: 12 model classes cannot run EAGLE-3 (--model NAME shows one, --json all)" in lines
    assert len(lines) < 20  # was 60, 47 of them EAGLE-3 wrappers
    assert not any("DotsOCRForCausalLM" in line for line in lines)


def test_model_narrows_the_eagle3_section() -> None:
    _, lines = _scan("--model", "dotsocr")
    eagle3 = [line for line in lines if "EAGLE-3" in line and line.startswith("  ")]
    assert len(eagle3) == 1 and eagle3[0].startswith("  FAIL  DotsOCRForCausalLM holds self.model (Qwen2ForCausalLM)")
    _, lines = _scan("--model", "gptoss")
    assert "  PASS  EAGLE-3: no gap in GptOssForCausalLM (the classes matching 'gptoss')" in lines


def test_a_model_name_that_matches_no_class_is_said_not_passed() -> None:
    # a typo must not read as "this model is fine"
    _, lines = _scan("--model", "NoSuchModel")
    eagle3 = [line for line in lines if "EAGLE-3" in line and line.startswith("  ")]
    assert eagle3 == [
        "  WARN  EAGLE-3: no registered model class matches 'NoSuchModel' (a part of the class name, such as "
        "LlamaForCausalLM; --json lists them all)"
    ]
