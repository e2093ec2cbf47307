"""Session fixtures for the SGLang scan/patch tests (each release scanned and patched once per session)."""

from __future__ import annotations

import json
import shutil

import pytest

from lab.sglang_releases import RELEASES, Json, PatchCycle, release_dir, run_cli, tree_hashes


@pytest.fixture(scope="session")
def scans() -> dict[str, Json]:
    """Scan JSON of every release for SM120 with a FlashInfer that supports it, computed once per session."""
    out: dict[str, Json] = {}
    for version in RELEASES:
        status, text = run_cli(
            "scan", "--json", "--cc", "12.0", "--flashinfer-version", "0.7.2", "--source", str(release_dir(version))
        )
        out[version] = {"status": status, **json.loads(text)}
    return out


@pytest.fixture(scope="session")
def cycles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PatchCycle]:
    out: dict[str, PatchCycle] = {}
    for version in RELEASES:
        copy = tmp_path_factory.mktemp(f"sglang-{version}") / "sglang"
        shutil.copytree(release_dir(version) / "sglang", copy)
        before = tree_hashes(copy)
        args = ("--source", str(copy), "--cc", "12.0", "--flashinfer-version", "0.7.2", "--json")
        first = json.loads(run_cli("patch", *args)[1])
        scan_status, scan_text = run_cli("scan", *args)
        second = json.loads(run_cli("patch", *args)[1])
        check_status, _ = run_cli("patch", "--check", *args)
        reverted = json.loads(run_cli("patch", "--revert", "--source", str(copy), "--json")[1])
        out[version] = PatchCycle(
            version,
            first,
            json.loads(scan_text),
            scan_status,
            second,
            check_status,
            reverted,
            before,
            tree_hashes(copy),
        )
        shutil.rmtree(copy.parent)
    return out
