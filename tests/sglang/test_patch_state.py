"""The patch state (`.sm120kit/`) cannot lose an original: journal, kills at every write, upgrades, hand edits,
ledger-less backups and OS errors. Fast tier: small synthetic trees; slow tier: real SGLang releases."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab.sglang_releases import release_dir, run_cli, tree_hashes
from sm120check.sglang import patch, scan, state
from sm120check.sglang.errors import SglangError
from sm120check.sglang.patch import FileChange
from sm120check.sglang.tree import SourceTree, parse_cc

FLAGS = ("--cc", "12.0", "--flashinfer-version", "0.7.2")
REPORT = SimpleNamespace(cc="12.0", flashinfer="0.7.2")  # all `apply` reads of a scan report
ORIGINALS = {"srt/a.py": "A = 1\n", "srt/sub/b.py": "B = 2\n", "srt/c.py": "C = 3\n"}
slow = pytest.mark.slow


# --- helpers ----------------------------------------------------------------------------------------------------


def _record_line(rel: str, data: bytes) -> str:
    b64 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={b64},{len(data)}\n"


def _synthetic(site: Path, *, record: bool = True, version: str = "0.0.1", files: dict[str, str] | None = None) -> Path:
    """site/sglang (a package with srt/) and, with `record`, site/sglang-<version>.dist-info/RECORD."""
    pkg = site / "sglang"
    contents = {"__init__.py": "", "_version.py": f'__version__ = "{version}"\n', **(files or ORIGINALS)}
    for rel, text in contents.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text, encoding="utf-8")
    if record:
        info = site / f"sglang-{version}.dist-info"
        info.mkdir()
        lines = [_record_line(f"sglang/{rel}", text.encode()) for rel, text in contents.items()]
        (info / "RECORD").write_text("".join(lines) + f"sglang-{version}.dist-info/RECORD,,\n", encoding="utf-8")
    return pkg


def _changes(pkg: Path, suffix: str = "  # sm120kit", note: str = "test edit") -> list[FileChange]:
    out = []  # idempotent, like the real plan: a file that has the edit already is left alone
    for rel in ORIGINALS:
        before = (pkg / rel).read_bytes()
        if suffix and suffix.encode() in before:
            continue
        out.append(FileChange(rel, before, before.rstrip(b"\n") + suffix.encode() + b"\n", (note,)))
    return out


def _apply(pkg: Path, changes: list[FileChange] | None = None) -> None:
    patch.apply(SourceTree(pkg), REPORT, changes or _changes(pkg))  # type: ignore[arg-type]


def _revert(pkg: Path, *flags: str) -> tuple[int, dict[str, object]]:
    status, out = run_cli("patch", "--revert", "--source", str(pkg), "--json", *flags)
    return status, json.loads(out.splitlines()[0] if status == 2 else out)


def _ledger(pkg: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((pkg / ".sm120kit" / "ledger.json").read_text(encoding="utf-8"))
    return data


def _arm(n: int, when: str) -> None:
    """SIGKILL this process at its n-th state write (os.replace or unlink), just before or just after it lands."""
    count = 0

    def hook(real: Callable[..., None]) -> Callable[..., None]:
        def step(*args: Path) -> None:
            nonlocal count
            count += 1
            if count == n and when == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            real(*args)
            if count == n and when == "after":
                os.kill(os.getpid(), signal.SIGKILL)

        return step

    state._replace = hook(state._replace)  # type: ignore[method-assign]
    state._remove = hook(state._remove)  # type: ignore[method-assign]


def _killed(n: int, when: str, work: Callable[[], object]) -> bool:
    """Run `work` in a forked child armed with `_arm(n, when)`; True when it died by SIGKILL, False when it ran out
    of writes first."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            _arm(n, when)
            work()
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, "the child failed before its kill"
    return False


def _steps(limit: int = 400) -> Iterator[int]:
    yield from range(1, limit)
    raise AssertionError("the kill never ran out of writes")


def _fresh(pristine: Path, work: Path) -> Path:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(pristine, work)
    return work / "sglang"


def _cp_advice(message: str) -> tuple[Path, Path]:
    match = re.search(r"\(cp (\S+) (\S+)\)", message)
    assert match, message
    return Path(match.group(1)), Path(match.group(2))


# --- fast: synthetic trees ----------------------------------------------------------------------------------------


def test_journal_names_every_file_before_the_first_write(tmp_path: Path) -> None:
    pkg = _synthetic(tmp_path / "site")
    before = tree_hashes(pkg)
    assert _killed(1, "after", lambda: _apply(pkg))
    journal = _ledger(pkg)
    assert journal["state"] == "in-progress" and journal["format"] == 2
    assert sorted(journal["files"]) == sorted(ORIGINALS)  # type: ignore[call-overload]
    assert {k: v for k, v in tree_hashes(pkg).items() if not k.startswith(".sm120kit")} == before


def test_complete_ledger_format(tmp_path: Path) -> None:
    pkg = _synthetic(tmp_path / "site")
    _apply(pkg)
    ledger = _ledger(pkg)
    entry = ledger["files"]["srt/a.py"]  # type: ignore[index]
    assert ledger["state"] == "complete" and ledger["sglang_version"] == "0.0.1"
    assert entry == {
        "sha256_before": hashlib.sha256(b"A = 1\n").hexdigest(),
        "sha256_after": hashlib.sha256(b"A = 1  # sm120kit\n").hexdigest(),
        "changes": ["test edit"],
    }
    assert (pkg / ".sm120kit/backup/srt/a.py").read_bytes() == b"A = 1\n"


@pytest.mark.parametrize("record", [True, False], ids=["record", "checkout"])
@pytest.mark.parametrize("when", ["before", "after"])
def test_kill_at_every_write_of_a_patch_then_revert(tmp_path: Path, record: bool, when: str) -> None:
    pristine = tmp_path / "pristine"
    _synthetic(pristine / "site", record=record)
    expected = tree_hashes(pristine / "site")
    for n in _steps():
        pkg = _fresh(pristine / "site", tmp_path / "work")
        if not _killed(n, when, lambda pkg=pkg: _apply(pkg)):  # type: ignore[misc]
            break
        assert _revert(pkg, "--check")[0] == 1, n
        assert _revert(pkg)[0] == 0, n
        assert tree_hashes(tmp_path / "work") == expected, n
    assert n == 2 * len(ORIGINALS) + 3  # journal, backup + file each, complete ledger; then it runs out


@pytest.mark.parametrize("when", ["before", "after"])
def test_kill_at_every_write_of_a_patch_then_patch_again(tmp_path: Path, when: str) -> None:
    pristine = tmp_path / "pristine"
    _synthetic(pristine / "site")
    expected = tree_hashes(pristine / "site")
    for n in _steps():
        pkg = _fresh(pristine / "site", tmp_path / "work")
        if not _killed(n, when, lambda pkg=pkg: _apply(pkg)):  # type: ignore[misc]
            break
        patch.recover(SourceTree(pkg))
        if _changes(pkg):
            _apply(pkg)
        assert (pkg / "srt/a.py").read_text(encoding="utf-8") == "A = 1  # sm120kit\n"
        assert _revert(pkg)[0] == 0, n
        assert tree_hashes(tmp_path / "work") == expected, n


def test_kill_at_every_write_of_a_second_patch(tmp_path: Path) -> None:
    """A file patched again: until the journal completes, both its old and new patched bytes are sm120check's."""
    pristine = tmp_path / "pristine"
    pkg = _synthetic(pristine / "site")
    expected = tree_hashes(pristine / "site")
    _apply(pkg)
    for n in _steps():
        pkg = _fresh(pristine / "site", tmp_path / "work")
        again = [FileChange(c.path, c.before, c.before + b"X = 0\n", ("more",)) for c in _changes(pkg, "")]
        if not _killed(n, "after", lambda pkg=pkg, again=again: _apply(pkg, again)):  # type: ignore[misc]
            break
        assert _revert(pkg)[0] == 0, n
        assert tree_hashes(tmp_path / "work") == expected, n


@pytest.mark.parametrize("record", [True, False], ids=["record", "checkout"])
def test_kill_at_every_write_of_a_revert(tmp_path: Path, record: bool) -> None:
    pristine = tmp_path / "pristine"
    _synthetic(pristine / "site", record=record)
    expected = tree_hashes(pristine / "site")
    patched = tmp_path / "patched"
    shutil.copytree(pristine, patched)
    _apply(patched / "site/sglang")
    for n in _steps():
        pkg = _fresh(patched / "site", tmp_path / "work")
        if not _killed(n, "after", lambda pkg=pkg: _revert(pkg)):  # type: ignore[misc]
            break
        assert _revert(pkg)[0] == 0, n
        assert tree_hashes(tmp_path / "work") == expected, n


def test_kill_at_every_write_of_a_recovery(tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    _synthetic(pristine / "site")
    expected = tree_hashes(pristine / "site")
    interrupted = tmp_path / "interrupted"
    shutil.copytree(pristine, interrupted)
    assert _killed(6, "after", lambda: _apply(interrupted / "site/sglang"))  # two files patched, c.py's backup written
    for n in _steps():
        pkg = _fresh(interrupted / "site", tmp_path / "work")
        if not _killed(n, "after", lambda pkg=pkg: patch.recover(SourceTree(pkg))):  # type: ignore[misc]
            break
        patch.recover(SourceTree(pkg))
        assert tree_hashes(tmp_path / "work") == expected, n


def test_repeated_patch_does_not_repeat_its_notes(tmp_path: Path) -> None:
    pkg = _synthetic(tmp_path / "site")
    _apply(pkg)
    again = [FileChange(c.path, c.before, c.before + b"X = 0\n", ("test edit", "other")) for c in _changes(pkg, "")]
    _apply(pkg, again)
    assert _ledger(pkg)["files"]["srt/a.py"]["changes"] == ["test edit", "other"]  # type: ignore[index]


def test_deleted_ledger_with_record_restores_the_verified_backups(tmp_path: Path) -> None:
    pkg = _synthetic(tmp_path / "site")
    expected = tree_hashes(tmp_path)
    _apply(pkg)
    (pkg / ".sm120kit/ledger.json").unlink()
    assert _revert(pkg, "--check")[0] == 1
    status, result = _revert(pkg)
    assert status == 0 and result["changed"]
    assert sorted(f["path"] for f in result["files"]) == sorted(ORIGINALS)  # type: ignore[attr-defined]
    assert tree_hashes(tmp_path) == expected


def test_deleted_ledger_with_record_is_recovered_before_a_patch(tmp_path: Path) -> None:
    pkg = _synthetic(tmp_path / "site")
    expected = tree_hashes(tmp_path)
    _apply(pkg)
    (pkg / ".sm120kit/ledger.json").unlink()
    (pkg / "srt/c.py").write_bytes((pkg / ".sm120kit/backup/srt/c.py").read_bytes())  # as if killed before c.py
    assert patch.recover(SourceTree(pkg), check=True).pending
    assert (pkg / ".sm120kit").is_dir()  # checking changed nothing
    done = patch.recover(SourceTree(pkg))
    assert sorted(done.restored) == ["srt/a.py", "srt/sub/b.py"] and done.rebaselined == ("srt/c.py",)
    assert tree_hashes(tmp_path) == expected


def test_deleted_ledger_in_a_checkout_is_refused_naming_the_folder_and_the_fix(tmp_path: Path) -> None:
    pkg = _synthetic(tmp_path / "site", record=False)
    expected = tree_hashes(tmp_path)
    _apply(pkg)
    (pkg / ".sm120kit/ledger.json").unlink()
    state_before = tree_hashes(tmp_path)
    assert _revert(pkg, "--check")[0] != 0
    status, result = _revert(pkg)
    folder = pkg / ".sm120kit"
    assert status == 2 and str(folder / "backup") in str(result["error"]) and "cp -r" in str(result["error"])
    assert tree_hashes(tmp_path) == state_before
    with pytest.raises(SglangError, match="no dist-info RECORD"):
        patch.recover(SourceTree(pkg))
    shutil.copytree(folder / "backup", pkg, dirs_exist_ok=True)  # the advice: cp -r backup/. sglang/, rm -r folder
    shutil.rmtree(folder)
    assert tree_hashes(tmp_path) == expected


@pytest.mark.parametrize("record", [True, False], ids=["record", "checkout"])
def test_hand_edit_is_refused_and_the_advice_works(tmp_path: Path, record: bool) -> None:
    pkg = _synthetic(tmp_path / "site", record=record)
    expected = tree_hashes(tmp_path)
    _apply(pkg)
    (pkg / "srt/sub/b.py").write_text("B = 'mine'\n", encoding="utf-8")
    edited = tree_hashes(tmp_path)
    status, result = _revert(pkg)
    assert status == 2 and str(pkg / "srt/sub/b.py") in str(result["error"])
    assert tree_hashes(tmp_path) == edited
    with pytest.raises(SglangError, match="changed after sm120check patched it"):
        patch.recover(SourceTree(pkg))
    backup, target = _cp_advice(str(result["error"]))
    shutil.copyfile(backup, target)
    status, result = _revert(pkg)
    assert status == 0 and result["skipped"] == ["srt/sub/b.py"]
    assert tree_hashes(tmp_path) == expected


def test_patched_file_deleted_is_refused_and_the_advice_works(tmp_path: Path) -> None:
    pkg = _synthetic(tmp_path / "site")
    expected = tree_hashes(tmp_path)
    _apply(pkg)
    (pkg / "srt/a.py").unlink()
    status, result = _revert(pkg)
    assert status == 2 and f"{pkg / 'srt/a.py'} is missing" in str(result["error"])
    backup, target = _cp_advice(str(result["error"]))
    shutil.copyfile(backup, target)
    assert _revert(pkg)[0] == 0
    assert tree_hashes(tmp_path) == expected


def _unchanged_after(pkg: Path, damage: Callable[[], object], *named: str) -> str:
    _apply(pkg)
    damage()
    before = tree_hashes(pkg.parent)
    status, result = _revert(pkg)
    error = str(result["error"])
    assert status == 2 and all(name in error for name in named), error
    assert "Traceback" not in error and tree_hashes(pkg.parent) == before
    return error


def test_missing_backup_is_exit_2_naming_it(tmp_path: Path) -> None:
    pkg = _synthetic(tmp_path / "site")
    backup = pkg / ".sm120kit/backup/srt/c.py"
    assert "reinstall" in _unchanged_after(pkg, backup.unlink, str(backup))


def test_patched_file_replaced_by_a_directory_is_exit_2_naming_it(tmp_path: Path) -> None:
    pkg = _synthetic(tmp_path / "site")

    def damage() -> None:
        (pkg / "srt/a.py").unlink()
        (pkg / "srt/a.py").mkdir()

    _unchanged_after(pkg, damage, str(pkg / "srt/a.py"))


def test_malformed_ledger_entry_is_exit_2_naming_the_ledger(tmp_path: Path) -> None:
    pkg = _synthetic(tmp_path / "site")
    ledger = pkg / ".sm120kit/ledger.json"

    def damage() -> None:
        data = json.loads(ledger.read_text(encoding="utf-8"))
        data["files"]["srt/a.py"] = "oops"
        ledger.write_text(json.dumps(data), encoding="utf-8")

    _unchanged_after(pkg, damage, str(ledger), "srt/a.py")


def test_state_folder_that_is_a_file_is_exit_2_naming_it(tmp_path: Path) -> None:
    pkg = _synthetic(tmp_path / "site")
    (pkg / ".sm120kit").write_text("not a folder\n", encoding="utf-8")
    status, result = _revert(pkg)
    assert status == 2 and f"{pkg / '.sm120kit'} is not a directory" in str(result["error"])
    with pytest.raises(SglangError, match="is not a directory"):
        patch.recover(SourceTree(pkg))


def _fail_at(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """The n-th state write (os.replace or unlink) fails as on a read-only mount."""
    calls: list[Path] = []

    def hook(real: Callable[..., None]) -> Callable[..., None]:
        def step(*args: Path) -> None:
            calls.append(args[-1])
            if len(calls) == n:
                raise OSError(30, "Read-only file system", str(args[-1]))
            real(*args)

        return step

    monkeypatch.setattr(state, "_replace", hook(state._replace))
    monkeypatch.setattr(state, "_remove", hook(state._remove))


@pytest.mark.parametrize("n", range(1, 2 * len(ORIGINALS) + 3))
def test_write_error_at_any_write_of_a_patch_puts_everything_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    pkg = _synthetic(tmp_path / "site")
    expected = tree_hashes(tmp_path)
    _fail_at(monkeypatch, n)
    with pytest.raises(SglangError, match=r": cannot write \(Read-only file system\).*nothing was changed"):
        _apply(pkg)
    monkeypatch.undo()
    assert tree_hashes(tmp_path) == expected and not (pkg / ".sm120kit").exists()


@pytest.mark.parametrize("n", range(1, 8))
def test_write_error_at_any_write_of_a_revert_is_exit_2_and_revert_finishes_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    pkg = _synthetic(tmp_path / "site")
    expected = tree_hashes(tmp_path)
    _apply(pkg)
    _fail_at(monkeypatch, n)
    status, result = _revert(pkg)
    assert status == 2 and "Read-only file system" in str(result["error"]) and str(pkg) in str(result["error"])
    monkeypatch.undo()
    assert _revert(pkg)[0] == 0
    assert tree_hashes(tmp_path) == expected


def _chattr(flag: str, path: Path) -> bool:
    chattr = shutil.which("chattr")
    if chattr is None:
        return False
    return subprocess.run([chattr, flag, str(path)], capture_output=True, check=False).returncode == 0


def test_immutable_file_is_exit_2_naming_it_and_nothing_changes(tmp_path: Path) -> None:
    pkg = _synthetic(tmp_path / "site")
    expected = tree_hashes(tmp_path)
    target = pkg / "srt/sub/b.py"
    if os.geteuid() != 0 or not _chattr("+i", target):
        pytest.skip("chattr +i needs root and a file system that supports it")
    try:
        with pytest.raises(SglangError, match=re.escape(f"{target}: cannot write (Operation not permitted)")):
            _apply(pkg)
    finally:
        _chattr("-i", target)
    assert tree_hashes(tmp_path) == expected and not (pkg / ".sm120kit").exists()


def test_os_error_in_the_cli_is_exit_2_naming_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = _synthetic(tmp_path / "site")
    _apply(pkg)
    before = tree_hashes(tmp_path)

    def denied(tmp: Path, path: Path) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(state, "_replace", denied)
    status, result = _revert(pkg)
    assert status == 2 and f"{pkg / 'srt/a.py'}: cannot write (Permission denied)" in str(result["error"])
    monkeypatch.undo()
    assert tree_hashes(tmp_path) == before


def test_a_gap_the_patch_leaves_open_is_exit_1_patch_needed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the edits land, a rescan that still finds a patchable gap means the tree still needs a patch (exit 1,
    as `--check` says), not a usage error (exit 2)."""
    pkg = _synthetic(tmp_path / "site")
    gap = SimpleNamespace(ok=False, patchable=True, summary="fusion gate: still closed")
    # A stand-in scan: a release whose gap the edits do not close cannot be built from a small synthetic tree.
    stand_in = SimpleNamespace(
        **vars(REPORT), flashinfer_origin="--flashinfer-version", blocked=[], findings=[gap], switch=None, stream=None
    )
    monkeypatch.setattr(scan, "run", lambda *_, **__: stand_in)
    monkeypatch.setattr(patch, "plan", lambda tree, found: _changes(tree.root))
    status, result = _patch(pkg)
    assert (status, result["changed"], result["remaining"]) == (1, True, ["fusion gate: still closed"])


def test_upgrade_with_record_rebaselines(tmp_path: Path) -> None:
    old = _synthetic(tmp_path / "old", version="0.0.1")
    _apply(old)
    new_files = {rel: text.replace("= ", "= 10 + ") for rel, text in ORIGINALS.items()}
    new = _synthetic(tmp_path / "new", version="0.0.2", files=new_files)
    expected = tree_hashes(tmp_path / "new")
    shutil.copytree(old / ".sm120kit", new / ".sm120kit")  # pip keeps the folder RECORD does not list
    done = patch.recover(SourceTree(new))
    assert sorted(done.rebaselined) == sorted(ORIGINALS) and not (new / ".sm120kit").exists()
    _apply(new)
    assert (new / ".sm120kit/backup/srt/a.py").read_text(encoding="utf-8") == new_files["srt/a.py"]
    assert _revert(new)[0] == 0
    assert tree_hashes(tmp_path / "new") == expected


def test_upgrade_without_record_is_refused_with_the_fix(tmp_path: Path) -> None:
    old = _synthetic(tmp_path / "old", version="0.0.1", record=False)
    _apply(old)
    new = _synthetic(tmp_path / "new", version="0.0.2", record=False, files={**ORIGINALS, "srt/a.py": "A = 11\n"})
    shutil.copytree(old / ".sm120kit", new / ".sm120kit")
    with pytest.raises(SglangError, match=re.escape(f"remove {new / '.sm120kit'} and patch again")):
        patch.recover(SourceTree(new))
    status, result = _revert(new)
    assert status == 2 and "records SGLang 0.0.1 but this tree is 0.0.2" in str(result["error"])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to another owner")
def test_patch_and_revert_keep_the_owner(tmp_path: Path) -> None:
    pkg = _synthetic(tmp_path / "site")
    for path in [pkg, *pkg.rglob("*")]:
        os.chown(path, 4321, 4322)
    _apply(pkg)
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in [pkg / "srt/a.py", *(pkg / ".sm120kit").rglob("*")]}
    assert owners == {(4321, 4322)}
    assert _revert(pkg)[0] == 0
    assert (pkg / "srt/a.py").stat().st_uid == 4321


# --- slow: real releases ------------------------------------------------------------------------------------------


def _site(tmp_path: Path, version: str, name: str = "site", *, record: bool = True) -> Path:
    """<tmp>/<name>/sglang and, with `record`, the release's dist-info beside it, as pip lays them out."""
    site = tmp_path / name
    shutil.copytree(release_dir(version) / "sglang", site / "sglang")
    if record:
        shutil.copytree(release_dir(version) / f"sglang-{version}.dist-info", site / f"sglang-{version}.dist-info")
    return site


def _patch(pkg: Path, *flags: str) -> tuple[int, dict[str, object]]:
    status, out = run_cli("patch", "--source", str(pkg), *FLAGS, "--json", *flags)
    return status, json.loads(out.splitlines()[0] if status == 2 else out)


@slow
@pytest.mark.parametrize("record", [True, False], ids=["record", "checkout"])
def test_upgrade_0_5_22_to_0_5_23_keeps_the_new_release(tmp_path: Path, record: bool) -> None:
    old = _site(tmp_path, "0.5.22", "old", record=record) / "sglang"
    new = _site(tmp_path, "0.5.23", "new", record=record) / "sglang"
    expected = tree_hashes(new.parent)
    assert _patch(old)[0] == 0
    shutil.copytree(old / ".sm120kit", new / ".sm120kit")
    if not record:  # no witness: refuse, and the fix it names works
        status, result = _patch(new)
        assert status == 2 and f"remove {new / '.sm120kit'} and patch again" in str(result["error"])
        assert _revert(new)[0] == 2
        shutil.rmtree(new / ".sm120kit")
    assert _patch(new, "--check")[0] == 1
    status, result = _patch(new)
    assert status == 0 and result["changed"]
    if record:
        assert len(result["rebaselined"]) > 20  # type: ignore[arg-type]
    assert _revert(new)[0] == 0
    assert tree_hashes(new.parent) == expected and not (new / ".sm120kit").exists()


def _kill_every_write(
    tmp_path: Path, version: str, after: Callable[[int], set[int]], before: Callable[[int], set[int]]
) -> int:
    """Kill a patch of `version` just after the writes `after(last)` land, and just before `before(last)` do; then
    patch (only after) and revert: byte-identical each time. Returns the number of files patched."""
    pristine = _site(tmp_path, version, "pristine")
    expected = tree_hashes(pristine)
    tree = SourceTree(pristine / "sglang")
    found = scan.run(tree, parse_cc("12.0"), "0.7.2", "--flashinfer-version")
    changes = patch.plan(tree, found)
    last = 2 * len(changes) + 2  # the journal, a backup and a file each, the complete ledger
    for when, n in sorted({("after", n) for n in after(last)} | {("before", n) for n in before(last)}):
        pkg = _fresh(pristine, tmp_path / "work")
        work = SourceTree(pkg)
        killed = _killed(n, when, lambda work=work: patch.apply(work, found, changes))  # type: ignore[misc]
        assert killed == (n <= last), n
        assert _revert(pkg, "--check")[0] == 1
        if when == "after":
            status, result = _patch(pkg)
            assert status == 0 and not result.get("remaining"), (n, result)
        assert _revert(pkg)[0] == 0, n
        assert tree_hashes(tmp_path / "work") == expected, (n, when)
    return len(changes)


def _every(last: int) -> set[int]:
    return set(range(1, last + 2))  # the last one runs out of writes: a complete patch


def _sample(last: int) -> set[int]:
    # the journal, the first backup (killed between backup and file), the first file, one write half way, the last
    # file and the complete ledger
    return {1, 2, 3, last // 2, last - 1, last}


@slow
def test_kill_at_every_write_of_a_0_5_4_patch(tmp_path: Path) -> None:
    assert _kill_every_write(tmp_path, "0.5.4", after=_every, before=_sample) > 10


@slow
def test_kill_at_sampled_writes_of_a_0_5_23_patch(tmp_path: Path) -> None:
    # the journal, the first backup (killed between backup and file), one write half way, the complete ledger
    assert _kill_every_write(tmp_path, "0.5.23", lambda last: {1, 2, last // 2, last}, lambda last: set()) > 20


DRIVER = """
import os, signal, sys
from sm120check.sglang import state
n, when, count = int(sys.argv[1]), sys.argv[2], [0]
def hook(real):
    def step(*args):
        count[0] += 1
        if count[0] == n and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        real(*args)
        if count[0] == n and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
    return step
state._replace, state._remove = hook(state._replace), hook(state._remove)
from sm120check.cli import main
sys.exit(main(sys.argv[3:]))
"""


@slow
@pytest.mark.parametrize(("n", "when"), [(1, "before"), (4, "after"), (9, "before")])
def test_kill_the_real_cli_mid_patch(tmp_path: Path, n: int, when: str) -> None:
    pristine = _site(tmp_path, "0.5.4")
    expected = tree_hashes(pristine)
    pkg = pristine / "sglang"
    argv = [sys.executable, "-c", DRIVER, str(n), when, "sglang", "patch", "--source", str(pkg), *FLAGS]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert _revert(pkg, "--check")[0] == 1
    status, result = _patch(pkg)
    assert status == 0 and result["changed"]
    assert _revert(pkg)[0] == 0
    assert tree_hashes(pristine) == expected


@slow
def test_old_style_kill_without_a_ledger_is_restored_from_record(tmp_path: Path) -> None:
    """sm120check before the journal wrote the ledger last: a kill left patched files and backups only."""
    site = _site(tmp_path, "0.5.23")
    expected = tree_hashes(site)
    pkg = site / "sglang"
    status, first = _patch(pkg)
    assert status == 0 and len(first["files"]) > 20  # type: ignore[arg-type]
    (pkg / ".sm120kit/ledger.json").unlink()
    assert _revert(pkg, "--check")[0] == 1
    status, result = _revert(pkg)
    assert status == 0 and len(result["files"]) == len(first["files"])  # type: ignore[arg-type]
    assert tree_hashes(site) == expected


@slow
def test_hand_edit_of_a_release_then_the_advice(tmp_path: Path) -> None:
    site = _site(tmp_path, "0.5.9")
    expected = tree_hashes(site)
    pkg = site / "sglang"
    _status, first = _patch(pkg)
    rel = first["files"][0]["path"]  # type: ignore[index]
    with (pkg / rel).open("a", encoding="utf-8") as handle:
        handle.write("# my tweak\n")
    status, result = _revert(pkg)
    assert status == 2 and str(pkg / rel) in str(result["error"])
    assert _patch(pkg)[0] == 2
    backup, target = _cp_advice(str(result["error"]))
    shutil.copyfile(backup, target)
    assert _revert(pkg)[0] == 0
    assert tree_hashes(site) == expected
