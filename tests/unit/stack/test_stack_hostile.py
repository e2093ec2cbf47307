"""`stack plan` and `stack resolve` on hostile files, caches and pips (reliability probe 3, defects 4, 6-10, 12-14,
19): stack.yml is read bounded and alias bombs are refused; the resolution cache is never trusted blindly and a cache
that cannot be written is said with the fix; a pip failure that is not about the pins is never cached as their
conflict; `--write` is atomic, never through a planted link, keeps the file's mode, and two runs at once take turns;
a name that would be a pip option never reaches pip. The real pip runs offline on a wheelhouse of stand-in wheels."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from stack_helpers import STACK, stack_cli, wheelhouse

SRC = Path(__file__).resolve().parents[3] / "python" / "sm120check" / "src"
FIX = "give the stack manifest (inventory/group_vars/all/stack.yml)"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SM120KIT_CACHE", str(root))
    return root


@pytest.fixture
def stack(tmp_path: Path) -> Path:
    path = tmp_path / "stack.yml"
    path.write_text(STACK, encoding="utf-8")
    return path


def fake_pip(tmp: Path, *, words: str = "", code: int = 1, report: str | None = None) -> Path:
    """A `pip` package that shadows the real one: prints `words` and exits `code`, or writes `report` as --report."""
    root = tmp / "fakepip"
    (root / "pip").mkdir(parents=True)
    (root / "pip" / "__init__.py").write_text("")
    (root / "pip" / "__main__.py").write_text(
        "import sys\n"
        f"report = {report!r}\n"
        "if report is not None:\n"
        "    open(sys.argv[sys.argv.index('--report') + 1], 'w').write(report)\n"
        "    sys.exit(0)\n"
        f"sys.stderr.write({words!r})\n"
        f"sys.exit({code})\n"
    )
    return root


# --- 4: stack.yml read bounded, regular files only, alias bombs refused -------------------------------------------


def test_a_device_or_a_fifo_as_stack_yml_is_refused_before_it_is_read(tmp_path: Path, cache: Path) -> None:
    code, _, err = stack_cli("plan", "--stack", "/dev/zero", "--set", "alpha=2.0")  # was 3.7 GB
    assert code == 2
    assert err == f"sm120check stack plan: /dev/zero: is a device, not a regular file; {FIX}\n"
    fifo = tmp_path / "f.yml"
    os.mkfifo(fifo)
    for argv in (["plan", "--stack", str(fifo), "--set", "alpha=2.0"], ["resolve", "--stack", str(fifo)]):
        code, _, err = stack_cli(*argv)  # was a hang
        assert code == 2 and f"{fifo}: is a FIFO (named pipe), not a regular file; {FIX}" in err


def test_a_stack_yml_over_its_bound_is_refused(tmp_path: Path, cache: Path) -> None:
    big = tmp_path / "big.yml"
    big.write_text(STACK + "# a comment\n" * 400_000, encoding="utf-8")  # was 55 s with --write
    code, _, err = stack_cli("plan", "--stack", str(big), "--set", "alpha=2.0", "--write")
    assert code == 2
    assert err == f"sm120check stack plan: {big}: larger than 4 MiB, the bound on this file; {FIX}\n"


BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9 if prev else ['x'] * 9)}]\n"
    for prev, name in zip(["", *"abcdefgh"], "abcdefghi", strict=True)
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["pin", "unrelated"])
def test_a_yaml_alias_bomb_is_refused(tmp_path: Path, cache: Path, where: str) -> None:
    path = tmp_path / "bomb.yml"
    text = STACK.replace('alpha: "1.0"  # the first pin', "alpha: *i") if where == "pin" else STACK + "unrelated: *i\n"
    path.write_text(BOMB + text, encoding="utf-8")  # was 2.2 GB and killed at 30 s; 3.9 GB and a MemoryError
    code, _, err = stack_cli("plan", "--stack", str(path), "--set", "beta=2.0", "--write")
    assert code == 2
    assert err == (
        f"sm120check stack plan: {path}: more than 100000 YAML values once its aliases are expanded; a stack manifest "
        "has a few hundred: remove the anchors and aliases (&name, *name)\n"
    )
    assert path.read_text(encoding="utf-8") == BOMB + text


# --- 10, 12: names, sections and versions checked before pip ---------------------------------------------------------


def test_a_package_name_that_is_a_pip_option_never_reaches_pip(tmp_path: Path, stack: Path, cache: Path) -> None:
    stack.write_text(STACK.replace("beta:", '"-rinj":'), encoding="utf-8")
    (tmp_path / "inj==1.0").write_text("r3probe-injected-requirement==1\n")
    code, out, err = stack_cli(
        "plan", "--stack", str(stack), "--wheelhouse", str(wheelhouse(tmp_path)), "--set", "alpha=2.0"
    )
    assert code == 2 and out == ""
    assert err.startswith(
        "sm120check stack plan: sm120kit_profiles.core.python_packages: '-rinj' is not a package name"
    )
    assert "r3probe" not in err


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ("sm120kit_profiles:\n  core:", 'sm120kit_profiles: "core full"\nx:\n  core:',
         "sm120kit_profiles is str 'core full', not a mapping of profile name to its python_packages"),
        ('  core:\n    python_packages:\n      alpha: "1.0"  # the first pin\n      beta: "1.0"\n', "  core: [a, b]\n",
         "sm120kit_profiles.core is list ['a', 'b'], not a mapping of python_packages and its other keys"),
        ("sm120kit_profile: core\n", "sm120kit_profile: core\nsm120kit_extra_python_packages: [a, b]\n",
         "sm120kit_extra_python_packages is list ['a', 'b'], not a mapping of package to version"),
        ("sm120kit_profile: core\n", "sm120kit_profile: nope\n",
         "profile 'nope' is not in sm120kit_profiles; use one of: core"),
        ('sm120kit_cuda_version: "13.0.1"\n', 'sm120kit_cuda_version: "thirteen"\n',
         "sm120kit_cuda_version: 'thirteen' is not a PEP 440 version"),
        ('sm120kit_cuda_version: "13.0.1"\n', "",
         "sm120kit_cuda_version: '' is not a PEP 440 version"),
        ('beta: "1.0"', "beta: [1]",
         "sm120kit_profiles.core.python_packages['beta'] is list [1], not a version; write it as a string"),
    ],
)  # fmt: skip
def test_a_value_that_is_not_what_the_manifest_holds_is_named(
    stack: Path, cache: Path, old: str, new: str, said: str
) -> None:
    assert old in STACK
    stack.write_text(STACK.replace(old, new), encoding="utf-8")
    for command in ("plan", "resolve"):
        code, _, err = stack_cli(command, "--stack", str(stack), *(["--set", "alpha=2.0"] if command == "plan" else []))
        assert code == 2, err
        assert err.startswith(f"sm120check stack {command}: {said}"), err
        assert "Traceback" not in err


def test_mixed_profile_keys_are_listed_not_a_traceback(stack: Path, cache: Path) -> None:
    stack.write_text(STACK.replace("sm120kit_profile: core", "sm120kit_profile: nope") + "  1: {}\n")
    code, _, err = stack_cli("resolve", "--stack", str(stack))
    assert (
        code == 2
        and err == "sm120check stack resolve: profile 'nope' is not in sm120kit_profiles; use one of: 1, core\n"
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--glibc", "abc"], "argument --glibc: glibc 'abc' is not a glibc version from 2.17 to 2.99"),
        (["--glibc", "2"], "argument --glibc: glibc '2' is not a glibc version from 2.17 to 2.99"),
        (["--glibc", "2.1000000"], "argument --glibc: glibc '2.1000000' is not a glibc version from 2.17 to 2.99"),
        (["--timeout", "inf"], "argument --timeout: 'inf' is not a finite number"),
        (["--timeout", "nan"], "argument --timeout: 'nan' is not a finite number"),
        (["--timeout", "0"], "argument --timeout: '0' is out of range"),
        (["--timeout", "-1"], "argument --timeout: '-1' is out of range"),
    ],
)
def test_a_bad_option_value_is_a_usage_error(stack: Path, cache: Path, argv: list[str], said: str) -> None:
    code, _, err = stack_cli("resolve", "--stack", str(stack), *argv)
    assert code == 2 and said in err and "Traceback" not in err


def test_a_request_with_a_bad_glibc_is_refused() -> None:
    request = {"stack": {}, "target": {"python": "3.12", "arch": "x86_64", "glibc": "abc"}, "sources": {}}
    code, _, err = stack_cli("resolve", "--request", json.dumps(request))
    assert code == 2 and "glibc 'abc' is not a glibc version from 2.17 to 2.99" in err


def test_a_wheel_whose_requirement_has_no_version_is_no_traceback(tmp_path: Path, stack: Path, cache: Path) -> None:
    house = wheelhouse(tmp_path, [("alpha", "3.0", ["cuda-toolkit==abc"])])
    code, out, err = stack_cli("plan", "--stack", str(stack), "--wheelhouse", str(house), "--set", "alpha=3.0")
    assert "Traceback" not in err
    assert code in (0, 1), err  # pip judges the line it alone can read
    assert "What moves:" in out


# --- 6: the resolution cache ----------------------------------------------------------------------------------------


def _resolve(stack: Path, house: Path, *argv: str) -> tuple[int, str, str]:
    return stack_cli("resolve", "--stack", str(stack), "--wheelhouse", str(house), *argv)


def test_damaged_metadata_entries_are_read_again_not_trusted(tmp_path: Path, stack: Path, cache: Path) -> None:
    house = wheelhouse(tmp_path)
    assert _resolve(stack, house)[0] == 0
    entries = sorted((cache / "metadata").glob("*.json"))
    assert len(entries) == 3
    entries[0].write_text("{}")  # was KeyError: 'name'
    entries[1].write_text("[" * 100_000)  # was RecursionError
    entries[2].write_text('{"name": "evil", "version": "9", "requires": []}')
    code, out, err = _resolve(stack, house, "--refresh")
    assert code == 0, err
    assert "pip resolved the pins" in out and "3 wheels, no conflict" in out
    assert f"ignoring the cache entry {entries[1]}: not a JSON cache entry; resolving again" in err
    assert all(json.loads(e.read_text())["name"] != "evil" for e in entries)  # rewritten


def test_a_damaged_or_planted_verdict_is_not_trusted(tmp_path: Path, stack: Path, cache: Path) -> None:
    house = wheelhouse(tmp_path)
    assert _resolve(stack, house)[0] == 0
    [verdict] = (cache / "resolve").glob("*.json")
    verdict.write_text('{"status": "ok", "digest": "x", "problems": [1, 2]}')  # was an AttributeError traceback
    code, out, err = _resolve(stack, house)
    assert code == 0 and "(cached" not in out and "Traceback" not in err
    assert "3 wheels, no conflict" in out
    planted = {"status": "ok", "digest": "elsewhere", "target": "", "sources": "", "resolved": {"a": "1"}}
    verdict.write_text(json.dumps(planted))  # was "pip resolved the pins for  from : 1 wheels"
    code, out, err = _resolve(stack, house)
    assert code == 0 and "3 wheels, no conflict" in out and "(cached" not in out
    assert f"ignoring the cache entry {verdict}: not a verdict on this manifest; resolving again" in err


def test_a_cache_that_cannot_be_written_is_said_with_the_fix(
    tmp_path: Path, stack: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "sm120kit"
    blocker.write_text("a file where the cache should be (one sudo run)")
    monkeypatch.setenv("SM120KIT_CACHE", str(blocker))
    code, out, err = _resolve(stack, wheelhouse(tmp_path))  # was NotADirectoryError after pip ran
    assert code == 0 and "3 wheels, no conflict" in out
    assert err.startswith(f"sm120check stack: warning: the resolution cache {blocker} cannot be written (")
    assert f"nothing is cached; remove it (`rm -rf {blocker}`; after a `sudo` run: `sudo rm -rf {blocker}`)" in err
    assert "Traceback" not in err


def _request(house: Path) -> str:
    """The request the preflight play's "Resolve the pins with pip on the control node" task passes, for STACK."""
    stack = yaml.safe_load(STACK)
    return json.dumps(
        {
            "stack": {
                "profile": "core",
                "python_packages": stack["sm120kit_profiles"]["core"]["python_packages"],
                "extra_python_packages": {},
                "cuda_version": stack["sm120kit_cuda_version"],
                "cuda_components": stack["sm120kit_cuda_components"],
                "nccl_version": stack["sm120kit_nccl_version"],
                "cuda_apt_version": stack["sm120kit_cuda_apt_version"],
            },
            "target": {"python": "3.12", "arch": "x86_64", "glibc": "2.39"},
            "sources": {"index_url": "", "extra_index_urls": [], "wheelhouse": str(house)},
        }
    )


def test_the_preflight_tasks_resolve_survives_a_damaged_or_unwritable_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PF3, PF4: the play's task (`--json --request`, failed unless rc is 0 or 1 and stdout is the JSON verdict) was
    `msg: non-zero return code` with the traceback in stderr and no fix named."""
    house = wheelhouse(tmp_path)
    argv = ("resolve", "--json", "--timeout", "120", "--request", _request(house))
    blocker = tmp_path / "sm120kit"
    blocker.write_text("a file where the cache should be (one sudo run)")
    monkeypatch.setenv("SM120KIT_CACHE", str(blocker))
    code, out, err = stack_cli(*argv)
    assert code == 0 and json.loads(out)["status"] == "ok"
    assert f"remove it (`rm -rf {blocker}`; after a `sudo` run: `sudo rm -rf {blocker}`)" in err
    cache = tmp_path / "cache"
    monkeypatch.setenv("SM120KIT_CACHE", str(cache))
    assert stack_cli(*argv)[0] == 0
    [verdict] = (cache / "resolve").glob("*.json")
    for damage in ('{"status": "ok", "digest": "x", "problems": [1, 2]}', "[" * 100_000):
        verdict.write_text(damage)
        code, out, err = stack_cli(*argv)
        assert code == 0 and json.loads(out)["status"] == "ok", err
        assert f"ignoring the cache entry {verdict}" in err and "Traceback" not in err


# --- 7, 19: pip failures that are not about the pins, hostile reports -----------------------------------------------

DISK_FULL = "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device\n"


def test_a_pip_failure_not_about_the_pins_is_not_cached_as_their_conflict(
    tmp_path: Path, stack: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    house = wheelhouse(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(fake_pip(tmp_path, words=DISK_FULL)))
    code, out, _ = _resolve(stack, house)
    assert code == 0  # skipped, said, not judged
    assert out.startswith("The pins were not resolved for Python 3.12")
    assert (
        "pip exited 1 for a reason that is not about the pins: ERROR: Could not install packages due to an OSError"
        in out
    )
    assert not (cache / "resolve").exists() or not any((cache / "resolve").iterdir())
    monkeypatch.delenv("PYTHONPATH")
    code, out, _ = _resolve(stack, house)  # the real pip now: was still "The pins conflict ... (cached)"
    assert code == 0 and "3 wheels, no conflict" in out and "cached" not in out


@pytest.mark.parametrize(
    ("report", "said"),
    [
        ("not json", "pip's report report.json is not JSON pip writes"),
        ("[" * 100_000, "pip's report report.json is not JSON pip writes: nested too deeply"),
        ('{"install": [{"metadata": {"name": 1, "version": "1"}}]}', "pip's report lists a wheel whose metadata"),
        ('{"install": ' + "1" * 5000 + "}", "pip's report report.json is not JSON pip writes"),
    ],
)
def test_a_hostile_pip_report_is_said_not_a_traceback(
    tmp_path: Path, stack: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, report: str, said: str
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(fake_pip(tmp_path, report=report)))
    code, out, err = _resolve(stack, wheelhouse(tmp_path))
    assert code == 0 and "Traceback" not in err
    assert out.startswith("The pins were not resolved") and said in out


def test_a_report_that_is_not_utf8_is_said(
    tmp_path: Path, stack: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = fake_pip(tmp_path, report="")
    main = root / "pip" / "__main__.py"
    main.write_text(main.read_text().replace("'w').write(report)", "'wb').write(b'{\\xff}')"))
    monkeypatch.setenv("PYTHONPATH", str(root))
    code, out, _ = _resolve(stack, wheelhouse(tmp_path))
    assert code == 0 and "pip's report cannot be read:" in out and "not UTF-8 text" in out


# --- 8, 9, 13, 14: --write ------------------------------------------------------------------------------------------


def _write(stack: Path, house: Path, *sets: str) -> tuple[int, str, str]:
    argv = [a for s in sets for a in ("--set", s)]
    return stack_cli("plan", "--stack", str(stack), "--wheelhouse", str(house), *argv, "--write")


def test_write_never_writes_through_a_planted_link(tmp_path: Path, stack: Path, cache: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("ORIGINAL\n")
    (tmp_path / ".stack.yml.partial").symlink_to(victim)  # the old fixed temporary name
    code, out, err = _write(stack, wheelhouse(tmp_path), "alpha=2.0")
    assert code == 0, err
    assert f"Wrote 1 value(s) into {stack}." in out
    assert victim.read_text() == "ORIGINAL\n"
    assert not stack.is_symlink() and yaml.safe_load(stack.read_text())["sm120kit_profiles"]["core"][
        "python_packages"
    ] == {
        "alpha": "2.0",
        "beta": "1.0",
    }
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".stack.yml")) == [
        ".stack.yml.lock",
        ".stack.yml.partial",
    ]  # no temporary file left


@pytest.mark.parametrize("mode", [0o600, 0o444])
def test_write_keeps_the_files_mode(tmp_path: Path, stack: Path, cache: Path, mode: int) -> None:
    stack.chmod(mode)  # a 0600 file holding index credentials became 0644
    code, _, err = _write(stack, wheelhouse(tmp_path), "alpha=2.0")
    assert code == 0, err
    assert stat.S_IMODE(stack.stat().st_mode) == mode
    assert '      alpha: "2.0"  # the first pin\n' in stack.read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user takes root")
def test_write_keeps_the_files_owner(tmp_path: Path, stack: Path, cache: Path) -> None:
    os.chown(stack, 65534, 65534)  # a 0600 stack.yml owned by nobody became root-owned (ST1)
    stack.chmod(0o600)
    code, _, err = _write(stack, wheelhouse(tmp_path), "alpha=2.0")
    assert code == 0, err
    after = stack.stat()
    assert (after.st_uid, after.st_gid, stat.S_IMODE(after.st_mode)) == (65534, 65534, 0o600)
    assert '      alpha: "2.0"  # the first pin\n' in stack.read_text()


def test_write_through_a_symlinked_stack_yml_updates_the_file_it_names(tmp_path: Path, cache: Path) -> None:
    real = tmp_path / "real" / "stack.yml"
    real.parent.mkdir()
    real.write_text(STACK)
    link = tmp_path / "stack.yml"
    link.symlink_to(real)
    code, _, err = _write(link, wheelhouse(tmp_path), "alpha=2.0")
    assert code == 0, err
    assert link.is_symlink() and '      alpha: "2.0"' in real.read_text()


def test_write_that_cannot_lock_is_a_clear_error_and_changes_nothing(tmp_path: Path, stack: Path, cache: Path) -> None:
    (tmp_path / ".stack.yml.lock").mkdir()  # as a read-only directory does: the lock cannot be made
    code, out, err = _write(stack, wheelhouse(tmp_path), "alpha=2.0")
    assert code == 2 and out == ""
    assert err.startswith(f"sm120check stack plan: cannot lock {stack} for writing (")
    assert "check that its directory is writable by you" in err
    assert stack.read_text() == STACK


@pytest.mark.skipif(os.geteuid() == 0, reason="running as a user that ignores file permissions (root)")
def test_write_into_a_read_only_directory_is_a_clear_error(tmp_path: Path, cache: Path) -> None:
    directory = tmp_path / "rod"
    directory.mkdir()
    stack = directory / "stack.yml"
    stack.write_text(STACK)
    (directory / ".stack.yml.lock").write_text("")
    directory.chmod(0o555)
    try:
        code, _, err = _write(stack, wheelhouse(tmp_path), "alpha=2.0")
    finally:
        directory.chmod(0o755)
    assert code == 2 and f"cannot write {stack}:" in err and "Traceback" not in err
    assert stack.read_text() == STACK


@pytest.mark.timeout(240)
def test_a_second_write_waits_for_the_first_and_keeps_both_changes(tmp_path: Path, stack: Path, cache: Path) -> None:
    from sm120check.stack import stackfile

    house = wheelhouse(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(SRC))
    argv = [sys.executable, "-m", "sm120check", "stack", "plan", "--stack", str(stack), "--wheelhouse", str(house)]
    with stackfile.lock(stack):  # a first run, between its read and its write
        second = subprocess.Popen(
            [*argv, "--set", "alpha=2.0", "--write"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        assert second.stderr is not None
        assert second.stderr.readline() == f"sm120check stack plan: waiting for another run writing {stack}\n"
        stack.write_text(STACK.replace('beta: "1.0"', 'beta: "2.0"'))  # the first run's write
    out, err = second.communicate(timeout=200)
    assert second.returncode == 0, err
    assert f"Wrote 1 value(s) into {stack}." in out
    pins = yaml.safe_load(stack.read_text())["sm120kit_profiles"]["core"]["python_packages"]
    assert pins == {"alpha": "2.0", "beta": "2.0"}  # both runs said "Wrote" and neither change is lost


def test_a_file_changed_under_the_plan_is_not_written(tmp_path: Path, stack: Path, cache: Path) -> None:
    from sm120check.stack import stackfile

    before = stackfile.stack_of(stackfile.load(stack), None)
    after = stackfile.stack_of(yaml.safe_load(STACK.replace('alpha: "1.0"', 'alpha: "2.0"')), None)
    edited = STACK.replace('beta: "1.0"', 'beta: "2.0"')
    stack.write_text(edited)  # another writer, between the plan's read and its write
    with pytest.raises(stackfile.StackChanged) as refused:
        stackfile.write(stack, before, after)
    assert str(refused.value).startswith(f"{stack} changed while the plan ran")
    assert stack.read_text() == edited


def _chattr(flag: str, path: Path) -> bool:
    try:
        return subprocess.run(["chattr", flag, str(path)], capture_output=True, timeout=10, check=False).returncode == 0
    except OSError:
        return False


@pytest.mark.parametrize("immutable", ["directory", "file"])
def test_write_that_cannot_replace_the_file_is_a_clear_error_and_leaves_nothing(
    tmp_path: Path, cache: Path, immutable: str
) -> None:
    directory = tmp_path / "rod"
    directory.mkdir()
    stack = directory / "stack.yml"
    stack.write_text(STACK)
    (directory / ".stack.yml.lock").write_text("")
    locked = directory if immutable == "directory" else stack
    if not _chattr("+i", locked):
        pytest.skip("chattr +i is not allowed here")
    try:  # was an OSError or PermissionError traceback after the plan, and a .stack.yml.partial left behind
        code, _, err = _write(stack, wheelhouse(tmp_path), "alpha=2.0")
    finally:
        _chattr("-i", locked)
    assert code == 2 and "Traceback" not in err
    assert err.startswith(f"sm120check stack plan: cannot write {stack}: ")
    assert err.endswith(
        "nothing was written - make the file and its directory writable, or write the plan's values by hand\n"
    )
    assert stack.read_text() == STACK
    assert sorted(p.name for p in directory.iterdir()) == [".stack.yml.lock", "stack.yml"]


@pytest.mark.timeout(60)
def test_pip_and_its_helpers_are_killed_at_the_timeout(
    tmp_path: Path, stack: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = fake_pip(tmp_path)
    pidfile = tmp_path / "helper.pid"
    (root / "pip" / "__main__.py").write_text(
        "import subprocess, sys, time\n"
        "helper = subprocess.Popen(['sleep', '991'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(helper.pid))\n"
        "while True: sys.stdout.write('Collecting ' * 1000); time.sleep(0.01)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(root))
    code, out, _ = _resolve(stack, wheelhouse(tmp_path), "--timeout", "3")  # pip's children outlived it (PR7)
    assert code == 0 and "pip did not finish within 3 s (preflight_resolve_timeout)" in out
    helper = int(pidfile.read_text())
    for _ in range(100):  # reaped by init once killed: bounded wait for the kernel to report it gone
        try:
            if Path(f"/proc/{helper}/stat").read_text().split()[2] == "Z":
                break
        except FileNotFoundError:
            break
        subprocess.run(["sleep", "0.05"], check=False)
    else:
        pytest.fail(f"pip's helper {helper} outlived the timeout")
