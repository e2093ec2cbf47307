"""The switch's companion edit of SGLang's output streamer (`sm120check sglang patch --plain-decode`) on the real 0.5.16
and 0.5.23 wheels' sources: the two speculative histograms go only with a request's last output, applied once with
the switch, reverted byte-identical, refused on other releases and on a streamer without its anchors; the committed
upstream patch files are that edit and `git apply` takes them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab.sglang_releases import (
    earlier_edit_refused_until_reverted,
    git_apply,
    release_dir,
    run_cli,
    tree_hashes,
    upstream_diff,
)
from sm120check.sglang import plain_decode, spec_stream
from sm120check.sglang.errors import SglangError

pytestmark = pytest.mark.slow
ARGS = ("--cc", "12.0", "--flashinfer-version", "0.7.2", "--json")
PATCHES = Path(__file__).resolve().parents[2] / "docs" / "patches"


def _copy(tmp_path: Path, version: str) -> Path:
    tree = tmp_path / version / "sglang"
    shutil.copytree(release_dir(version) / "sglang", tree)
    return tree


def _streamer(tree: Path) -> str:
    return (tree / spec_stream.PATH).read_text(encoding="utf-8")


@pytest.mark.parametrize("version", spec_stream.SUPPORTED)
def test_the_edit_lands_with_the_switch_once_and_reverts_byte_identical(tmp_path: Path, version: str) -> None:
    tree = _copy(tmp_path, version)
    before = tree_hashes(tree)
    assert json.loads(run_cli("scan", "--source", str(tree), *ARGS)[1])["spec_stream"]["applied"] is False
    status, out = run_cli("patch", "--source", str(tree), "--plain-decode", *ARGS)
    assert status == 0, out
    changed = {f["path"]: f["changes"] for f in json.loads(out)["files"]}
    assert changed[spec_stream.PATH] == ["speculative histograms sent only with a request's last output"]
    assert spec_stream.applied(_streamer(tree))
    again = json.loads(run_cli("patch", "--source", str(tree), "--plain-decode", *ARGS)[1])
    assert again["files"] == [] and not again["needed"]
    scanned = json.loads(run_cli("scan", "--source", str(tree), *ARGS)[1])
    assert scanned["spec_stream"]["applied"] is True
    assert run_cli("patch", "--source", str(tree), "--revert", "--json")[0] == 0
    assert tree_hashes(tree) == before


@pytest.mark.parametrize("version", spec_stream.SUPPORTED)
def test_an_unfinished_request_sends_the_empty_tuple_and_a_finished_one_its_histograms(version: str) -> None:
    """The edited statements, taken from the patched release file and run on a request of each state."""
    text = spec_stream.add(_streamer(release_dir(version) / "sglang"), version)
    statements = [line.strip() for line in text.splitlines() if "sent only with a request's last output" in line]
    assert len(statements) == 2
    for finished in (False, True):
        req = SimpleNamespace(
            finished=lambda done=finished: done, spec_correct_drafts_histogram=[3, 1, 4], spec_cap_lens_histogram=[2, 7]
        )
        out = SimpleNamespace(spec_correct_drafts_histogram=[], spec_cap_lens_histogram=[])
        for statement in statements:
            exec(statement, {}, {"self": out, "req": req})  # the release's own line, as patched
        want = ([[3, 1, 4]], [[2, 7]]) if finished else ([()], [()])
        assert (out.spec_correct_drafts_histogram, out.spec_cap_lens_histogram) == want
    # every unfinished request sends the one empty tuple: pickle writes no object a request, and the reader
    # (`if histogram and len(histogram) > i and histogram[i]`) sees no histogram
    unfinished = SimpleNamespace(finished=lambda: False, spec_correct_drafts_histogram=[1], spec_cap_lens_histogram=[2])
    out = SimpleNamespace(spec_correct_drafts_histogram=[], spec_cap_lens_histogram=[])
    for _ in range(3):
        for statement in statements:
            exec(statement, {}, {"self": out, "req": unfinished})
    assert len({id(h) for h in out.spec_correct_drafts_histogram + out.spec_cap_lens_histogram}) == 1
    assert not out.spec_correct_drafts_histogram[0]


@pytest.mark.parametrize("version", spec_stream.SUPPORTED)
def test_the_released_reader_takes_the_edits_entries(version: str) -> None:
    """The HTTP process's reader of the histograms (`TokenizerManager`), as released, guards every entry by its
    truth: an unfinished request's entry is skipped, a finished one's read."""
    source = (release_dir(version) / "sglang" / "srt/managers/tokenizer_manager.py").read_text(encoding="utf-8")
    for field in spec_stream.FIELDS:
        assert f"and recv_obj.{field}[i]" in source, field  # the entry's truth decides


def test_a_tree_with_the_edits_first_version_is_refused_until_reverted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree an earlier sm120check patched with a new empty list a request: scan says so, patch refuses with the fix
    and changes nothing, and revert then patch gives the current edit."""
    tree = _copy(tmp_path, "0.5.16")
    current = spec_stream.add
    with monkeypatch.context() as m:
        m.setattr(spec_stream, "add", lambda text, version: current(text, version).replace("else ()", "else []"))
        m.setattr(spec_stream, "applied", lambda text: "else [])  # sm120kit" in text)
        assert run_cli("patch", "--source", str(tree), "--plain-decode", *ARGS)[0] == 0
    assert spec_stream.earlier(_streamer(tree)) and not spec_stream.applied(_streamer(tree))
    earlier_edit_refused_until_reverted(tree, spec_stream.PATCH_ID, ARGS)
    assert spec_stream.applied(_streamer(tree))


def test_other_releases_are_refused_with_nothing_changed(tmp_path: Path) -> None:
    tree = _copy(tmp_path, "0.5.14")
    before = tree_hashes(tree)
    status, out = run_cli("patch", "--source", str(tree), "--plain-decode", *ARGS)
    assert status != 0 and "--plain-decode refused" in json.loads(out)["error"]
    assert tree_hashes(tree) == before
    with pytest.raises(SglangError, match=r"SGLang 0\.5\.14: the speculative-stream edit is written for 0\.5\.16"):
        spec_stream.add("", "0.5.14")


def test_a_streamer_without_its_anchor_refuses_the_switch_naming_it(tmp_path: Path) -> None:
    tree = _copy(tmp_path, "0.5.16")
    path = tree / spec_stream.PATH
    path.write_text(_streamer(tree).replace("self.spec_cap_lens_histogram.append(", "self.other.append("))
    before = tree_hashes(tree)
    status, out = run_cli("patch", "--source", str(tree), "--plain-decode", *ARGS)
    error = json.loads(out)["error"]
    assert status != 0 and "`self.spec_cap_lens_histogram.append(req.spec_cap_lens_histogram)` not found" in error
    assert tree_hashes(tree) == before


@pytest.mark.parametrize("version", spec_stream.SUPPORTED)
def test_the_upstream_patch_file_is_the_edit_and_git_applies_it(tmp_path: Path, version: str) -> None:
    committed = PATCHES / f"sglang-{version}-spec-stream.patch"
    original = _streamer(release_dir(version) / "sglang")
    patched = spec_stream.add(original, version)
    assert committed.read_text(encoding="utf-8") == upstream_diff(original, patched, spec_stream.PATH)
    tree = _copy(tmp_path, version)
    run = git_apply(committed, tree)
    assert run.returncode == 0, run.stderr
    assert _streamer(tree) == spec_stream.add(original, version)


def test_a_tree_patched_with_the_switch_alone_takes_the_edit_on_the_next_patch_and_reverts_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree an earlier sm120check patched with the switch but no streamer edit: scan asks for the edit, the next
    `patch --plain-decode` adds only it, and one revert restores the release byte for byte."""
    tree = _copy(tmp_path, "0.5.23")
    before = tree_hashes(tree)
    assert spec_stream.PATH not in {
        f["path"] for f in json.loads(run_cli("patch", "--source", str(tree), *ARGS)[1])["files"]
    }
    with monkeypatch.context() as m:
        m.setattr(spec_stream, "add", lambda text, version: text)
        # exit 1: the rescan after the edits still finds the streamer's edit missing
        assert run_cli("patch", "--source", str(tree), "--plain-decode", *ARGS)[0] == 1
    assert plain_decode.applied((tree / plain_decode.PATH).read_text()) and not spec_stream.applied(_streamer(tree))
    scanned = json.loads(run_cli("scan", "--source", str(tree), "--plain-decode", *ARGS)[1])
    finding = next(f for f in scanned["findings"] if f["id"] == spec_stream.PATCH_ID)
    assert (finding["ok"], finding["patchable"]) == (False, True)
    status, out = run_cli("patch", "--source", str(tree), "--plain-decode", *ARGS)
    assert status == 0 and [f["path"] for f in json.loads(out)["files"]] == [spec_stream.PATH]
    assert spec_stream.applied(_streamer(tree))
    assert run_cli("patch", "--source", str(tree), "--revert", "--json")[0] == 0
    assert tree_hashes(tree) == before
