"""`sm120check jit` (or `python -m sm120check.jitcache`): key, status, build, pack, verify, unpack.

Run it with the stack venv's interpreter: the key, the cache path and the build are that interpreter's. Every
subcommand prints one JSON object with --json (what the flashinfer_jit role reads) and a short text otherwise.
Exit 2 also covers a key that cannot be computed and a cache this node cannot write (read-only, full disk: the
message names the path); on SIGTERM (143) the staging directory is removed first and nothing is changed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sm120check.exitcodes import Exit
from sm120check.jitcache import bundle as bundles
from sm120check.jitcache import layout
from sm120check.jitcache import modules as jit_modules
from sm120check.jitcache.key import KEY_FIELDS, CacheKey, KeyProblem, compute
from sm120check.jitcache.layout import ARCH_LIST_ENV
from sm120check.jitcache.ninja import dry_run, find_ninja
from sm120check.safetext import terminal_text


class Terminated(BaseException):
    """SIGTERM, raised where the process is, so that `finally` blocks (the staging directory's removal) run."""


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While a bundle is read or installed, SIGTERM raises Terminated once; a second one during the clean-up is only
    noted, so the clean-up finishes (SIGKILL still ends it; the next unpack then removes what was left)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def handler(signum: int, frame: object) -> None:
        nonlocal fired
        if not fired:
            fired = True
            raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _modules(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one module, e.g. trtllm_comm,pcie_ipc_comm")
    return names


def _common(parser: argparse.ArgumentParser, modules: bool = True) -> None:
    parser.add_argument(
        "--arch-list", default=None, help=f"JIT targets, e.g. '12.0f' (default: ${ARCH_LIST_ENV}, else the GPUs)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    if modules:
        parser.add_argument(
            "--modules",
            type=_modules,
            default=None,
            help="comma separated (default: the serving modules this FlashInfer provides for the key's targets, "
            f"of {', '.join(jit_modules.SERVING)})",
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    _common(sub.add_parser("key", help="this node's cache key"), modules=False)
    status = sub.add_parser("status", help="per module: cached for this key, or what a load would do")
    _common(status)
    status.add_argument(
        "--regenerate", action="store_true", help="rewrite build.ninja as FlashInfer would (imports it)"
    )
    build = sub.add_parser("build", help="build the modules not cached, with progress; optionally pack them")
    _common(build)
    build.add_argument("--bundle", type=Path, help="write a bundle of the modules here afterwards")
    pack = sub.add_parser("pack", help="pack built modules into a checksummed bundle")
    _common(pack)
    pack.add_argument("--out", type=Path, required=True)
    pack.add_argument("--libraries-only", action="store_true", help="only each module's .so (for unpack --into aot)")
    for name, text in (("verify", "check a bundle's checksums (and key)"), ("unpack", "verify, then install a bundle")):
        action = sub.add_parser(name, help=text)
        _common(action, modules=False)
        action.add_argument("bundle", type=Path)
        action.add_argument("--no-key-check", action="store_true", help="skip comparing with this node's key")
        if name == "unpack":
            action.add_argument(
                "--into",
                choices=("cache", "aot"),
                default="cache",
                help="cache: FlashInfer's JIT cache (default); aot: FlashInfer's prebuilt-module directory of the "
                "imported package, loaded without ninja (scratch installs only)",
            )
        action.add_argument(
            "--ignore", default="", help=f"key fields not to compare, comma separated ({', '.join(KEY_FIELDS)})"
        )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "jit", help="FlashInfer JIT cache: key, status, build, pack, verify, unpack", description=__doc__
    )
    add_arguments(parser)
    parser.set_defaults(handler=run)


def _emit(ns: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    print(json.dumps(data, sort_keys=True) if ns.json else terminal_text(text), flush=True)


def _env(ns: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    if ns.arch_list:
        env[ARCH_LIST_ENV] = ns.arch_list
    return env


def _this_key(ns: argparse.Namespace) -> tuple[CacheKey, dict[str, str]]:
    key, context = compute(_env(ns), ns.arch_list)
    return key, asdict(context)


def _cache_root(ns: argparse.Namespace) -> Path:
    return layout.cache_root(_env(ns))


def default_modules(key: CacheKey) -> list[str]:
    """The serving modules a server with this key loads: `jitcache.modules.for_release` of its FlashInfer and arch."""
    return list(jit_modules.for_release(key.flashinfer, layout.target_majors(key.arch.split("_"))))


def _key_data(key: CacheKey, context: dict[str, str]) -> dict[str, Any]:
    return {"key": key.as_dict(), "slug": key.slug(), "context": context}


def _status(ns: argparse.Namespace, key: CacheKey) -> list[dict[str, Any]]:
    if ns.regenerate:
        _prepare_flashinfer(ns)
        for name in ns.modules:
            jit_modules.spec_for(name).write_ninja()
    ninja = find_ninja() or "ninja"
    rows = []
    for name in ns.modules:
        directory = layout.module_dir(_cache_root(ns), key.flashinfer, key.arch, name)
        verdict = dry_run(directory, ninja)
        cached = verdict.clean and (directory / f"{name}.so").is_file()
        rows.append(
            {
                "module": name,
                "cached": cached,
                "dir": str(directory),
                "ninja": verdict.summary(),
                "stamp": bundles.read_stamp(directory),
            }
        )
    return rows


def _prepare_flashinfer(ns: argparse.Namespace) -> None:
    """FlashInfer reads its targets and cache path at import: set them first."""
    if ns.arch_list:
        os.environ[ARCH_LIST_ENV] = ns.arch_list


def _do_build(ns: argparse.Namespace, key: CacheKey, context: dict[str, str]) -> int:
    _prepare_flashinfer(ns)
    from sm120check.jitcache import build as builder
    from sm120check.jitcache.key import BuildContext

    ninja = find_ninja()
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if ns.json else print
    outcomes = builder.build(ns.modules, ninja, progress=say)
    for outcome in outcomes:
        if outcome.built:
            bundles.write_stamp(Path(outcome.module_dir), key, outcome.name, outcome.seconds)
    data: dict[str, Any] = {**_key_data(key, context), "modules": [asdict(o) for o in outcomes]}
    data["changed"] = any(o.built for o in outcomes)
    if ns.bundle:
        seconds = {o.name: o.seconds for o in outcomes}
        stamps = {o.name: bundles.read_stamp(Path(o.module_dir)).get("seconds", 0.0) for o in outcomes}
        manifest = bundles.pack(
            _cache_root(ns),
            key,
            BuildContext(**context),
            ns.modules,
            ns.bundle,
            {n: seconds[n] or float(stamps[n] or 0.0) for n in seconds},
        )
        data["bundle"] = {
            "path": str(ns.bundle),
            "sha256": bundles.sha256_file(ns.bundle),
            "files": len(manifest.files),
        }
    lines = [f"{o.name}: {'cached' if o.cached_before else f'built in {o.seconds:.0f} s'}" for o in outcomes]
    _emit(ns, data, "\n".join(lines + ([f"bundle {ns.bundle}"] if ns.bundle else [])))
    return Exit.OK


def run(ns: argparse.Namespace) -> int:
    try:
        key, context = _this_key(ns) if not getattr(ns, "no_key_check", False) else (None, {})
    except KeyProblem as exc:
        print(f"sm120check jit: {terminal_text(exc)}", file=sys.stderr)
        return Exit.USAGE
    try:
        if getattr(ns, "modules", "") is None and key is not None:
            ns.modules = default_modules(key)
            if not ns.modules:
                print(
                    f"sm120check jit: FlashInfer {key.flashinfer} has no serving JIT module for {key.arch}; "
                    "name some with --modules",
                    file=sys.stderr,
                )
                return Exit.USAGE
        if ns.action == "key":
            assert key is not None
            _emit(ns, _key_data(key, context), f"{key.slug()}\n" + json.dumps(context, indent=1))
        elif ns.action == "status":
            assert key is not None
            rows = _status(ns, key)
            _emit(
                ns,
                {**_key_data(key, context), "modules": rows},
                "\n".join(f"{r['module']}: {'cached' if r['cached'] else 'not cached'} ({r['ninja']})" for r in rows),
            )
        elif ns.action == "build":
            assert key is not None
            return _do_build(ns, key, context)
        elif ns.action == "pack":
            assert key is not None
            from sm120check.jitcache.key import BuildContext

            manifest = bundles.pack(
                _cache_root(ns), key, BuildContext(**context), ns.modules, ns.out, libraries_only=ns.libraries_only
            )
            _emit(
                ns,
                {"bundle": str(ns.out), "files": len(manifest.files), "sha256": bundles.sha256_file(ns.out)},
                f"{ns.out}: {len(manifest.files)} files",
            )
        else:
            ignore = [f for f in ns.ignore.split(",") if f]
            unknown = sorted(set(ignore) - set(KEY_FIELDS))
            if unknown:
                print(
                    f"sm120check jit: --ignore {','.join(unknown)}: not key fields ({', '.join(KEY_FIELDS)})",
                    file=sys.stderr,
                )
                return Exit.USAGE
            with _sigterm_raises():
                return _bundle_action(ns, key, ignore)
    except bundles.BundleError as exc:
        if ns.json:
            print(json.dumps({"ok": False, "problem": str(exc)}))
        print(f"sm120check jit: {terminal_text(exc)}", file=sys.stderr)
        return Exit.FOUND
    except (bundles.CacheProblem, OSError) as exc:
        if ns.json:
            print(json.dumps({"ok": False, "problem": str(exc)}))
        print(f"sm120check jit: {terminal_text(exc)}", file=sys.stderr)
        return Exit.USAGE
    except Terminated:
        print(
            "sm120check jit: terminated (SIGTERM); the staging directory was removed, nothing changed", file=sys.stderr
        )
        return Exit.TERMINATED
    except ValueError as exc:
        print(f"sm120check jit: {terminal_text(exc)}", file=sys.stderr)
        return Exit.USAGE
    return Exit.OK


def _bundle_action(ns: argparse.Namespace, key: CacheKey | None, ignore: list[str]) -> int:
    """verify or unpack."""
    if ns.action == "verify":
        manifest = bundles.verify(ns.bundle, key, ignore)
        _emit(
            ns,
            {
                "ok": True,
                "key": manifest.key.as_dict(),
                "files": len(manifest.files),
                "modules": list(manifest.modules),
            },
            f"{ns.bundle}: {len(manifest.files)} files verified",
        )
    else:
        if ns.into == "aot":
            from sm120check.jitcache.key import package_dir

            target = Path(package_dir("flashinfer")) / "data" / "aot"
            done = bundles.install_aot(ns.bundle, target, key, ignore)
        else:
            target = _cache_root(ns)
            done = bundles.unpack(ns.bundle, target, key, ignore)
        _emit(
            ns,
            {"ok": True, "changed": True, "cache_root": str(target), **asdict(done), "key": done.key.as_dict()},
            f"{ns.bundle}: {done.files} files into {target} in {done.seconds} s",
        )
    return Exit.OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sm120check.jitcache", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
