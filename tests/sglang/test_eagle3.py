"""EAGLE-3 delegation that is true or refused: the inner model is resolved, and only a method it has is delegated.

The first half runs on a small synthetic SGLang tree (every shape the resolver handles, in a few lines each);
the second on the real releases (marked slow).
"""

from __future__ import annotations

import ast
import functools
import textwrap
from pathlib import Path

import pytest

from lab.sglang_releases import RELEASES, PatchCycle, release_dir
from sm120check.sglang import eagle, patch, scan
from sm120check.sglang.textedit import MARK
from sm120check.sglang.tree import ComputeCapability, SourceTree

CONTRACT = ("get_embed_and_head", "set_eagle3_layers_to_capture")
CAPTURE = "set_eagle3_layers_to_capture"
LEFT_AS_IS = ("eagle3-unsupported:", "eagle3-runtime:", "eagle3-partial:")

WORKER = """
class EAGLEWorker:
    def init(self, ids):
        embed, head = self.target_worker.model_runner.model.get_embed_and_head()
        self.target_worker.model_runner.model.set_eagle3_layers_to_capture(ids)
"""

INNER = """
from torch import nn


class GoodModel(nn.Module):
    pass


class GoodForCausalLM(nn.Module):
    def __init__(self, config):
        self.model = GoodModel()

    def get_embed_and_head(self):
        return self.model.embed_tokens.weight, self.lm_head.weight

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.model.layers_to_capture = layer_ids


class InheritsForCausalLM(GoodForCausalLM):
    pass


class BareForCausalLM(nn.Module):
    def __init__(self, config):
        self.model = GoodModel()


class HalfForCausalLM(nn.Module):
    def get_embed_and_head(self):
        return None, None


EntryClass = [GoodForCausalLM, InheritsForCausalLM, BareForCausalLM, HalfForCausalLM]
"""

WRAPPERS = '''
from torch import nn

from . import inner as inner_mod
from .inner import BareForCausalLM, GoodForCausalLM
import sglang.srt.models.inner as aliased

MODELS = {"good": GoodForCausalLM, "inherits": aliased.InheritsForCausalLM}


def general_mm_embed_routine(**kwargs):
    return kwargs


class RelativeVL(nn.Module):
    """Relative import, runs the inner model through general_mm_embed_routine: patched."""

    def __init__(self, config):
        self.language_model = GoodForCausalLM(config)

    def forward(self, input_ids):
        return general_mm_embed_routine(input_ids=input_ids, language_model=self.language_model)


class BareVL(nn.Module):
    """Its inner model has neither method: unsupported, never patched."""

    def __init__(self, config):
        self.language_model = None
        self.language_model = BareForCausalLM(config)

    def forward(self, x):
        return self.language_model(x)


class HalfVL(nn.Module):
    """Its inner model has get_embed_and_head only: unsupported (the capture has nothing to call)."""

    def __init__(self, config):
        from sglang.srt.models.inner import HalfForCausalLM

        self.language_model = HalfForCausalLM(config)

    def forward(self, x):
        return self.language_model(x)


class MixedVL(nn.Module):
    """Two possible inner classes, one without the methods: patched, with a warning naming that one."""

    def __init__(self, config):
        if config.bare:
            self.language_model = inner_mod.BareForCausalLM(config)
        else:
            self.language_model = aliased.GoodForCausalLM(config)

    def forward(self, x):
        return self.language_model.forward(x)


class TableLLM(nn.Module):
    """self.llm from a dict of classes: both have the methods, patched."""

    def __init__(self, config):
        llm_cls = MODELS[config.kind]
        self.llm = llm_cls(config)

    def forward(self, x):
        return self.llm(x)


class FactoryLLM(nn.Module):
    """self.llm from a factory method that a subclass could override: resolved through the concrete class."""

    def __init__(self, config):
        self.llm = self.init_llm(config)

    def init_llm(self, config):
        return GoodForCausalLM(config) if config.a else aliased.InheritsForCausalLM(config)

    def forward(self, x):
        return self.llm(x)


class RuntimeVL(nn.Module):
    """The inner class is an argument: cannot be checked, not patched."""

    def __init__(self, config, language_model_cls=GoodForCausalLM):
        self.language_model = language_model_cls(config)

    def forward(self, x):
        return self.language_model(x)


class BypassLLM(nn.Module):
    """Runs the inner transformer body and its own head: the captured states would never come back."""

    def __init__(self, config):
        self.llm = GoodForCausalLM(config)

    def forward(self, x):
        hidden = general_mm_embed_routine(language_model=self.llm.model, x=x)
        return self.logits_processor(hidden, self.llm.lm_head)


class OCRWhole(nn.Module):
    """self.model holding a registered whole model: a wrapper."""

    def __init__(self, config):
        self.model = GoodForCausalLM(config)

    def forward(self, x):
        return self.model(x)


class PlainForCausalLM(nn.Module):
    """self.model holding its transformer body: a plain causal LM, no wrapper, no finding."""

    def __init__(self, config):
        self.model = inner_mod.GoodModel()

    def forward(self, x):
        return self.model(x)


class ParentVL(nn.Module):
    def __init__(self, config):
        self.language_model = GoodForCausalLM(config)

    def forward(self, x):
        return self.language_model(x)


class ChildBareVL(ParentVL):
    """Unsupported below a patchable parent: the parent must not be patched, or this one would inherit it."""

    def __init__(self, config):
        self.language_model = BareForCausalLM(config)


class SubRelativeVL(RelativeVL):
    """Inherits its parent's inner model: gets the parent's delegation."""


class CaptureMixin:
    def get_embed_and_head(self):
        return None, None

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        pass


class TopVL(nn.Module):
    """Patchable by itself, but a method here would replace what MixedInVL inherits from its mixin: not patched."""

    def __init__(self, config):
        self.language_model = GoodForCausalLM(config)

    def forward(self, x):
        return self.language_model(x)


class MixedInVL(TopVL, CaptureMixin):
    pass


EntryClass = [
    RelativeVL,
    BareVL,
    HalfVL,
    MixedVL,
    TableLLM,
    FactoryLLM,
    RuntimeVL,
    BypassLLM,
    OCRWhole,
    PlainForCausalLM,
    ParentVL,
    ChildBareVL,
    SubRelativeVL,
    TopVL,
    MixedInVL,
]
'''


def _mini_tree(root: Path) -> SourceTree:
    pkg = root / "sglang"
    for rel, text in {
        "__init__.py": "",
        "srt/__init__.py": "",
        "srt/speculative/eagle_worker.py": WORKER,
        "srt/models/__init__.py": "",
        "srt/models/inner.py": INNER,
        "srt/models/wrappers.py": WRAPPERS,
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(textwrap.dedent(text))
    return SourceTree(pkg)


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> tuple[SourceTree, eagle.EagleScan]:
    tree = _mini_tree(tmp_path_factory.mktemp("eagle3"))
    return tree, eagle.scan(tree)


def _audit(found: eagle.EagleScan, name: str) -> eagle.ModelAudit:
    return next(m for m in found.models if m.name == name)


def _findings(found: eagle.EagleScan) -> dict[str, tuple[bool, bool, str]]:
    return {fid: (ok, patchable, summary) for fid, ok, patchable, summary, _ in eagle.findings(found)}


def test_verdicts_on_every_shape_the_resolver_reads(mini: tuple[SourceTree, eagle.EagleScan]) -> None:
    _tree, found = mini
    verdicts = {m.name: m.verdict for m in found.models if m.verdict}
    assert verdicts == {
        "RelativeVL": eagle.PATCH,
        "BareVL": eagle.UNSUPPORTED,
        "HalfVL": eagle.UNSUPPORTED,
        "MixedVL": eagle.PARTIAL,
        "TableLLM": eagle.PATCH,
        "FactoryLLM": eagle.PATCH,
        "RuntimeVL": eagle.RUNTIME,
        "BypassLLM": eagle.UNSUPPORTED,
        "OCRWhole": eagle.PATCH,
        "ParentVL": eagle.UNSUPPORTED,
        "ChildBareVL": eagle.UNSUPPORTED,
        "SubRelativeVL": eagle.PATCH,
        "TopVL": eagle.UNSUPPORTED,
    }
    assert {m.name: m.attr for m in found.models if m.wrapper} == {
        "RelativeVL": "language_model",
        "BareVL": "language_model",
        "HalfVL": "language_model",
        "MixedVL": "language_model",
        "TableLLM": "llm",
        "FactoryLLM": "llm",
        "RuntimeVL": "language_model",
        "BypassLLM": "llm",
        "OCRWhole": "model",
        "ParentVL": "language_model",
        "ChildBareVL": "language_model",
        "SubRelativeVL": "language_model",
        "TopVL": "language_model",
        "MixedInVL": "language_model",
    }


def test_inner_classes_are_resolved_through_imports_tables_and_factories(
    mini: tuple[SourceTree, eagle.EagleScan],
) -> None:
    _tree, found = mini
    inner = {m.name: sorted(i.name for i in m.inner) for m in found.models if m.wrapper}
    assert inner["RelativeVL"] == ["GoodForCausalLM"]  # from .inner import
    assert inner["HalfVL"] == ["HalfForCausalLM"]  # import inside __init__
    assert inner["MixedVL"] == ["BareForCausalLM", "GoodForCausalLM"]  # from . import inner as x; import ... as y
    assert inner["TableLLM"] == ["GoodForCausalLM", "InheritsForCausalLM"]  # a module-level dict
    assert inner["FactoryLLM"] == ["GoodForCausalLM", "InheritsForCausalLM"]  # self.init_llm() returns either
    assert inner["BareVL"] == ["BareForCausalLM"]  # `self.language_model = None` first is not a class
    assert _audit(found, "RuntimeVL").runtime_inner == ("language_model_cls (an argument of __init__)",)


def test_a_plain_causal_lm_holding_its_body_in_self_model_is_no_wrapper(
    mini: tuple[SourceTree, eagle.EagleScan],
) -> None:
    _tree, found = mini
    plain = _audit(found, "PlainForCausalLM")
    assert not plain.wrapper and plain.missing == CONTRACT and plain.verdict == ""
    assert not any(fid.endswith(":PlainForCausalLM") for fid in _findings(found))


def test_unsupported_and_runtime_findings_are_not_patchable_and_say_why(
    mini: tuple[SourceTree, eagle.EagleScan],
) -> None:
    _tree, found = mini
    findings = _findings(found)
    ok, patchable, summary = findings["eagle3-unsupported:BareVL"]
    assert (ok, patchable) == (False, False)
    assert summary.startswith("EAGLE-3 not supported for BareVL: inner BareForCausalLM has no ")
    assert "get_embed_and_head, set_eagle3_layers_to_capture" in summary
    assert "inner HalfForCausalLM has no set_eagle3_layers_to_capture;" in findings["eagle3-unsupported:HalfVL"][2]
    assert (
        "its forward runs self.llm.model and self.llm.lm_head, not self.llm"
        in findings["eagle3-unsupported:BypassLLM"][2]
    )
    ok, patchable, summary = findings["eagle3-runtime:RuntimeVL"]
    assert (ok, patchable) == (False, False) and "cannot check: inner class chosen at run time" in summary
    assert "would also reach ChildBareVL" in findings["eagle3-unsupported:ParentVL"][2]
    summary = findings["eagle3-unsupported:TopVL"][2]
    assert "would also reach MixedInVL, which already has it (inherits from CaptureMixin)" in summary
    ok, patchable, summary = findings["eagle3:MixedVL"]
    assert (ok, patchable) == (False, True) and "inner BareForCausalLM has no get_embed_and_head" in summary
    assert {fid for fid, (_, patchable, _) in findings.items() if patchable} == {
        f"eagle3:{name}" for name in ("RelativeVL", "MixedVL", "TableLLM", "FactoryLLM", "OCRWhole", "SubRelativeVL")
    }


def test_delegations_go_only_where_the_inner_model_has_the_methods(
    mini: tuple[SourceTree, eagle.EagleScan],
) -> None:
    _tree, found = mini
    targets = {d.cls: d for d in found.targets}
    assert set(targets) == {"RelativeVL", "MixedVL", "TableLLM", "FactoryLLM", "OCRWhole"}
    assert targets["RelativeVL"].covers == ("RelativeVL", "SubRelativeVL")  # the subclass inherits it
    assert targets["MixedVL"].inner == ("GoodForCausalLM",)
    assert (targets["TableLLM"].attr, targets["OCRWhole"].attr) == ("llm", "model")
    assert all(d.methods == CONTRACT for d in targets.values())


def _patched(tree: SourceTree, found: eagle.EagleScan) -> dict[str, str]:
    texts: dict[str, str] = {}
    for d in found.targets:
        text = texts.get(d.path) or tree.read(d.path)
        texts[d.path] = eagle.add_delegation(text, d.path, d.cls, d.methods, d.attr, d.inner)
    return texts


def _class(text: str, name: str) -> ast.ClassDef:
    return next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == name)


def _functions(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def test_rescan_after_the_delegation_is_clean_but_keeps_unsupported_and_partial(
    mini: tuple[SourceTree, eagle.EagleScan], tmp_path: Path
) -> None:
    tree, found = mini
    copy = _mini_tree(tmp_path)
    for rel, text in _patched(tree, found).items():
        (copy.root / rel).write_text(text)
    after = eagle.scan(copy)
    findings = _findings(after)
    assert not [fid for fid, (_, patchable, _) in findings.items() if patchable]
    assert after.targets == ()
    assert set(findings) == {
        "eagle3-unsupported:BareVL",
        "eagle3-unsupported:HalfVL",
        "eagle3-unsupported:BypassLLM",
        "eagle3-unsupported:ParentVL",
        "eagle3-unsupported:ChildBareVL",
        "eagle3-unsupported:TopVL",
        "eagle3-runtime:RuntimeVL",
        "eagle3-partial:MixedVL",  # patched, and still says which inner class cannot answer
    }
    assert "inner BareForCausalLM has no" in findings["eagle3-partial:MixedVL"][2]
    text = (copy.root / "srt/models/wrappers.py").read_text()
    for name in ("BareVL", "HalfVL", "BypassLLM", "ParentVL", "ChildBareVL", "RuntimeVL", "TopVL"):
        assert not set(_functions(_class(text, name))) & set(CONTRACT), name


def test_generated_methods_call_the_inner_model_directly_without_hasattr(
    mini: tuple[SourceTree, eagle.EagleScan],
) -> None:
    tree, found = mini
    cls = _class(_patched(tree, found)["srt/models/wrappers.py"], "TableLLM")
    methods = _functions(cls)
    assert ast.unparse(methods[CAPTURE].args) == "self, layer_ids=None"
    assert ast.unparse(methods["get_embed_and_head"].args) == "self"
    for fn in (methods[CAPTURE], methods["get_embed_and_head"]):
        assert "hasattr" not in ast.unparse(fn)
    assert ast.unparse(methods[CAPTURE].body) == "return self.llm.set_eagle3_layers_to_capture(layer_ids)"  # type: ignore[arg-type]  # unparse takes a statement list too
    assert ast.unparse(methods["get_embed_and_head"].body) == "return self.llm.get_embed_and_head()"  # type: ignore[arg-type]  # unparse takes a statement list too


def _stand_in(cls: ast.ClassDef, attr: str, inner: object) -> object:
    """An object of a class holding only the generated methods, with `inner` as self.<attr>."""
    body = [fn for name, fn in _functions(cls).items() if name in CONTRACT]
    code = "class StandIn:\n" + textwrap.indent("\n".join(ast.unparse(fn) for fn in body), "    ")
    namespace: dict[str, object] = {}
    exec(compile(code, "<delegation>", "exec"), namespace)  # our own generated methods, nothing else
    obj = namespace["StandIn"]()  # type: ignore[operator]
    setattr(obj, attr, inner)
    return obj


class _Inner:
    def __init__(self) -> None:
        self.captured: list[object] = []

    def get_embed_and_head(self) -> tuple[str, str]:
        return ("embed", "head")

    def set_eagle3_layers_to_capture(self, layer_ids: object = None) -> None:
        self.captured.append(layer_ids)


class _Bare:
    pass


def _check_delegation_runs(cls: ast.ClassDef, attr: str) -> None:
    inner = _Inner()
    obj = _stand_in(cls, attr, inner)
    assert obj.get_embed_and_head() == ("embed", "head")  # type: ignore[attr-defined]
    obj.set_eagle3_layers_to_capture([1, 2, 3])  # type: ignore[attr-defined]
    obj.set_eagle3_layers_to_capture()  # type: ignore[attr-defined]
    assert inner.captured == [[1, 2, 3], None]
    bare = _stand_in(cls, attr, _Bare())
    with pytest.raises(AttributeError, match="_Bare"):  # never a silent no-op
        bare.set_eagle3_layers_to_capture([1])  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="_Bare"):
        bare.get_embed_and_head()  # type: ignore[attr-defined]


def test_generated_methods_return_what_the_inner_model_returns(mini: tuple[SourceTree, eagle.EagleScan]) -> None:
    tree, found = mini
    text = _patched(tree, found)["srt/models/wrappers.py"]
    _check_delegation_runs(_class(text, "TableLLM"), "llm")
    _check_delegation_runs(_class(text, "RelativeVL"), "language_model")


def test_every_added_line_carries_the_mark(mini: tuple[SourceTree, eagle.EagleScan]) -> None:
    tree, found = mini
    before = tree.read("srt/models/wrappers.py").splitlines()
    after = _patched(tree, found)["srt/models/wrappers.py"].splitlines()
    added = [line for line in after if line not in before and line.strip()]
    assert added and all(MARK in line for line in added)


# --- the real releases ---------------------------------------------------------------------------------------------

LLM_MODEL_THINKER_0_5_23 = {
    "NVILAForConditionalGeneration": ("llm", eagle.PATCH),
    "NVILALiteForConditionalGeneration": ("llm", eagle.PATCH),
    "POINTSV15ChatModel": ("llm", eagle.PATCH),
    "Sarashina2VisionForCausalLM": ("llm", eagle.UNSUPPORTED),  # forward runs self.llm.model and its own head
    "DeepseekOCRForCausalLM": ("model", eagle.PARTIAL),  # DeepseekForCausalLM lacks both
    "DotsOCRForCausalLM": ("model", eagle.PATCH),
    "BailingMMNativeForConditionalGeneration": ("model", eagle.PATCH),
    "BailingMM2NativeForConditionalGeneration": ("model", eagle.PATCH),
    "Qwen3OmniMoeForConditionalGeneration": ("thinker", eagle.PATCH),
}


@functools.cache
def _tree(version: str) -> SourceTree:
    return SourceTree(release_dir(version) / "sglang")


@functools.cache
def _scan(version: str) -> eagle.EagleScan:
    return eagle.scan(_tree(version))


@functools.cache
def _plan(version: str) -> dict[str, str]:
    """Patched text of every file the patch would change, computed in memory from the read-only release."""
    tree = _tree(version)
    found = scan.run(tree, ComputeCapability(12, 0, "--cc"), "0.7.2", "--flashinfer-version")
    return {ch.path: ch.after.decode("utf-8") for ch in patch.plan(tree, found)}


def _added_methods(version: str) -> list[tuple[str, str, ast.FunctionDef]]:
    """(file, class, method) of every method the patch adds to a model class."""
    tree = _tree(version)
    out = []
    for rel, text in _plan(version).items():
        if not rel.startswith("srt/models/"):
            continue
        old = {n.name: n for n in ast.parse(tree.read(rel)).body if isinstance(n, ast.ClassDef)}
        for cls in (n for n in ast.parse(text).body if isinstance(n, ast.ClassDef)):
            had = set(_functions(old[cls.name])) if cls.name in old else set()
            out += [(rel, cls.name, fn) for name, fn in _functions(cls).items() if name not in had]
    return out


@pytest.mark.slow
def test_kimi_k3_in_0_5_23_is_unsupported_and_not_patched() -> None:
    audit = _audit(_scan("0.5.23"), "KimiK3ForConditionalGeneration")
    assert audit.verdict == eagle.UNSUPPORTED and audit.attr == "language_model"
    assert [(i.name, i.lacks) for i in audit.inner] == [("KimiK3LinearForCausalLM", CONTRACT)]
    findings = _findings(_scan("0.5.23"))
    ok, patchable, summary = findings["eagle3-unsupported:KimiK3ForConditionalGeneration"]
    assert (ok, patchable) == (False, False)
    assert summary.startswith(
        "EAGLE-3 not supported for KimiK3ForConditionalGeneration: inner KimiK3LinearForCausalLM has no "
        "get_embed_and_head, set_eagle3_layers_to_capture"
    )
    assert "eagle3:KimiK3ForConditionalGeneration" not in findings
    assert not [d for d in _scan("0.5.23").targets if d.cls == "KimiK3ForConditionalGeneration"]
    text = _plan("0.5.23").get("srt/models/kimi_k3.py")
    if text is not None:  # another finding may touch the file; the class gets no EAGLE-3 method either way
        assert not set(_functions(_class(text, "KimiK3ForConditionalGeneration"))) & set(CONTRACT)


@pytest.mark.slow
def test_kimi_k25_in_0_5_9_is_patched_with_a_direct_delegation() -> None:
    audit = _audit(_scan("0.5.9"), "KimiK25ForConditionalGeneration")
    assert audit.verdict == eagle.PATCH and [i.name for i in audit.inner] == ["DeepseekV3ForCausalLM"]
    cls = _class(_plan("0.5.9")["srt/models/kimi_k25.py"], "KimiK25ForConditionalGeneration")
    methods = _functions(cls)
    assert "hasattr" not in ast.unparse(methods["get_embed_and_head"]) + ast.unparse(methods[CAPTURE])
    assert ast.unparse(methods["get_embed_and_head"].body) == "return self.language_model.get_embed_and_head()"  # type: ignore[arg-type]  # unparse takes a statement list too
    assert ast.unparse(methods[CAPTURE].body) == "return self.language_model.set_eagle3_layers_to_capture(layer_ids)"  # type: ignore[arg-type]  # unparse takes a statement list too
    assert ast.unparse(methods[CAPTURE].args) == "self, layer_ids=None"
    _check_delegation_runs(cls, "language_model")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LLM_MODEL_THINKER_0_5_23))
def test_wrappers_holding_llm_model_or_thinker_are_found_in_0_5_23(name: str) -> None:
    attr, verdict = LLM_MODEL_THINKER_0_5_23[name]
    audit = _audit(_scan("0.5.23"), name)
    assert (audit.attr, audit.verdict) == (attr, verdict)
    delegated = {d.cls for d in _scan("0.5.23").targets}
    if verdict == eagle.UNSUPPORTED:
        assert name not in delegated and "not supported" in eagle.summary(audit)
    else:
        assert name in delegated or any(name in d.covers for d in _scan("0.5.23").targets)


@pytest.mark.slow
def test_dots_ocr_gets_only_the_capture_method() -> None:
    target = next(d for d in _scan("0.5.23").targets if d.cls == "DotsOCRForCausalLM")
    assert (target.attr, target.methods, target.inner) == ("model", (CAPTURE,), ("Qwen2ForCausalLM",))


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_no_plain_causal_lm_is_reported_as_a_wrapper(version: str) -> None:
    found = _scan(version)
    reported = {fid.split(":", 1)[1] for fid, *_ in eagle.findings(found)}
    for name in ("LlamaForCausalLM", "Qwen2ForCausalLM", "DeepseekV2ForCausalLM", "Qwen3ForCausalLM"):
        audit = _audit(found, name)
        assert not audit.wrapper and name not in reported
    for m in found.models:
        if m.attr == "model":  # self.model counts only when it holds a registered whole model
            assert all(i.name.endswith(("ForCausalLM", "ForConditionalGeneration")) for i in m.inner), m.name


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_no_reported_gap_is_a_method_the_model_has(version: str) -> None:
    found = _scan(version)
    for m in (*found.wrapper_gaps, *found.unsupported, *found.runtime_inner):
        assert m.missing and all(dict(m.methods)[name] == "missing" for name in m.missing)


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_every_patched_delegation_reaches_an_inner_class_that_has_the_method(version: str) -> None:
    """Read the methods out of the patched text and resolve the inner classes again, with a fresh index."""
    tree, found = _tree(version), _scan(version)
    summaries = {fid.split(":", 1)[1]: summary for fid, _, _, summary, _ in eagle.findings(found)}
    index = eagle._Index(tree)
    added = _added_methods(version)
    assert added, "the patch adds delegation methods in every release tested"
    for rel, owner, fn in added:
        assert fn.name in CONTRACT and "hasattr" not in ast.unparse(fn), (rel, owner, fn.name)
        call = next(n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute))
        assert isinstance(call.func, ast.Attribute) and call.func.attr == fn.name
        attr = ast.unparse(call.func.value).removeprefix("self.")
        cls = index.lookup(rel, owner)
        assert cls is not None
        assigned, (inner, runtime) = eagle._held(index, cls, attr)
        assert assigned and inner and not runtime, (rel, owner, attr)
        has = {c.node.name: eagle._status(index, c, fn.name) != "missing" for c in inner}
        assert any(has.values()), (owner, has)
        for lacking in (n for n, ok in has.items() if not ok):  # partial: the finding names each of them
            assert f"inner {lacking} has no" in summaries[owner]


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_llava_for_conditional_generation_has_a_run_time_inner_class(version: str) -> None:
    found = _scan(version)
    audit = _audit(found, "LlavaForConditionalGeneration")
    assert audit.verdict == eagle.RUNTIME and audit.inner == ()
    assert any("_get_sgl_model_cls" in value for value in audit.runtime_inner)
    assert "cannot check: inner class chosen at run time" in eagle.summary(audit)
    assert not [d for d in found.targets if d.cls == "LlavaForConditionalGeneration"]
    text = _plan(version)["srt/models/llava.py"]
    assert not set(_functions(_class(text, "LlavaForConditionalGeneration"))) & {CAPTURE}


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_rescan_after_patch_keeps_unsupported_models_reported(cycles: dict[str, PatchCycle], version: str) -> None:
    cycle = cycles[version]
    assert cycle.first["remaining"] == []
    left = [f for f in cycle.scan_after["findings"] if not f["ok"] and f["id"].startswith("eagle3")]
    assert left and all(f["id"].startswith(LEFT_AS_IS) and not f["patchable"] for f in left)
    before = {m["class"] for m in _json_unsupported(version)}
    after = {m["class"] for m in cycle.scan_after["eagle3"]["unsupported"]}
    assert before == after and after  # unsupported before the patch, still unsupported (and unpatched) after
    assert cycle.scan_after["eagle3"]["wrapper_gaps"] == []


def _json_unsupported(version: str) -> list[dict[str, object]]:
    return eagle.to_dict(_scan(version))["unsupported"]  # type: ignore[return-value]


@pytest.mark.slow
def test_doctor_names_the_models_eagle3_is_not_available_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from sm120check.doctor.model import Context, Status
    from sm120check.doctor.sglang_sm120 import sglang as check_module

    real = scan.run

    def patched_view(*args: object, **kwargs: object) -> scan.ScanReport:
        found = real(*args, **kwargs)  # type: ignore[arg-type]
        return replace(found, findings=tuple(f for f in found.findings if not f.patchable))

    monkeypatch.setattr("sm120check.sglang.tree.find_installed", lambda: release_dir("0.5.23") / "sglang")
    monkeypatch.setattr(scan, "run", patched_view)
    result = check_module.SglangSm120().run(Context())
    assert result.status is Status.WARN
    assert "EAGLE-3 not available for" in result.summary and "see details" in result.summary
    assert "EAGLE-3 not supported for KimiK3ForConditionalGeneration" in (result.details or "")
