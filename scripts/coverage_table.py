#!/usr/bin/env python3
"""The GPU coverage table (docs/validation/README.md), generated from the headers of the validation records.

scripts/coverage_table.py          parse every docs/validation/*/README.md header, write docs/validation/README.md
scripts/coverage_table.py --check  exit 1 when a header is missing or invalid, or docs/validation/README.md is stale

A record's header is front matter at the very top of its README.md (see HEADER_HELP). Rows: every doctor check that
reads or needs a GPU (GPU_CHECKS) and every script in tests/gpu and scripts/device (GPU_SCRIPTS); columns: the
machine classes. A cell is the latest record on that class whose `checks` list gave the row a real outcome, and says
whether the files that row runs changed after the record's commit (git history of HEAD, plus uncommitted edits, of
source files only: commits that touch only docs/validation never change the table).
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = "docs/validation"
TABLE = f"{VALIDATION}/README.md"

MACHINES = ("1x H200", "1x H100", "2x H200 NVLink", "PCIe multi-GPU", "SM120")
MACHINE_KINDS = (*MACHINES, "none")
FIELDS = ("date", "commit", "machine", "gpus", "interconnect", "commands", "result", "pytest", "checks")
LIST_FIELDS = frozenset({"commands", "checks"})
RAN = frozenset({"pass", "warn", "fail", "partial", "ran"})  # outcomes that mean the row's code really ran
OUTCOMES = (*sorted(RAN), "skip")

_SRC = "python/sm120check/src/sm120check"
_D = f"{_SRC}/doctor"
_NVML = (
    f"{_D}/preflight/driver.py",
    f"{_D}/facts.py",
    f"{_D}/gpu/nvml_info_probe.py",
    f"{_D}/gpu/nvml_info_payload.py",
)
_HEALTH = (
    f"{_D}/node_health/health.py",
    f"{_D}/gpu/node_health_probe.py",
    f"{_D}/gpu/payloads.py",
    f"{_D}/node_health/verdicts.py",
    f"{_D}/gpu/nvml_health.py",
    f"{_D}/gpu/kernel_log.py",
    f"{_D}/gpu/xid.py",
    f"{_D}/gpu/ancestry.py",
    f"{_D}/gpu/load.py",
    f"{_D}/nvml_api.py",
    f"{_D}/nvrtc_api.py",
)
_RANKS = (f"{_D}/comm/collectives.py", f"{_D}/collective.py", f"{_D}/ranks.py", f"{_D}/collective_payload.py")
_TORCH = (f"{_D}/python_stack/torch_info_probe.py", f"{_D}/python_stack/torch_info_payload.py", f"{_D}/loader.py")
# The PCIe fabric readers (sysfs of the NVIDIA GPUs and the bridges above them, lspci, the pcie_p2p fact file).
_PCIE = (
    f"{_D}/pcie_p2p/fabric.py",
    f"{_D}/pcie/node.py",
    f"{_D}/pcie/sysfs.py",
    f"{_D}/pcie/lspci.py",
    f"{_D}/pcie/cmdline.py",
    f"{_D}/pcie/kernel_log.py",
    f"{_D}/pcie/fact_file.py",
    f"{_SRC}/bounded.py",
)
_JIT = (f"{_SRC}/jitcache/layout.py", f"{_SRC}/jitcache/modules.py", f"{_SRC}/jitcache/ninja.py")

# Every doctor check that reads a GPU (level 1) or needs one (levels 2-3) -> the files it runs. A check in the
# catalogue that is in neither GPU_CHECKS nor CPU_CHECKS is an error, so this map cannot fall behind the doctor.
GPU_CHECKS: Mapping[str, tuple[str, ...]] = {
    "driver": (*_NVML, f"{_D}/nvml_api.py"),
    "gpu_nodes": (f"{_D}/preflight/driver.py",),
    "gpu_persistence": (*_NVML, f"{_D}/nvml_api.py"),
    "sglang_sm120": (f"{_D}/sglang_sm120/sglang.py", f"{_SRC}/sglang"),  # the first GPU's compute capability
    "flashinfer_jit": (
        f"{_D}/flashinfer_jit/flashinfer_jit.py",
        *_JIT,
        f"{_SRC}/jitcache/bundle.py",
        f"{_SRC}/jitcache/cost.py",
    ),
    "iommu": _PCIE,  # reads the GPUs' PCI functions in sysfs: a real outcome needs a machine with NVIDIA GPUs
    "pcie_acs": _PCIE,
    "gpu_xid": _HEALTH,
    "gpu_ecc": _HEALTH,
    "pcie_replay": _HEALTH,
    "gpu_mig": _HEALTH,
    "gpu_bar1": _HEALTH,
    "gpu_processes": _HEALTH,
    "gpu_product": (*_HEALTH, f"{_D}/node_health/sglang_configs.py"),
    "sm120_jit": (
        f"{_D}/cuda_toolkit/nvrtc_launch.py",
        f"{_D}/cuda_toolkit/nvrtc.py",
        f"{_D}/cuda_toolkit/nvrtc_launch_probe.py",
        f"{_D}/cuda_toolkit/nvrtc_launch_payload.py",
        f"{_D}/nvrtc_api.py",
        f"{_D}/cuda_api.py",
    ),
    "torch": (f"{_D}/python_stack/torch.py", *_TORCH, f"{_D}/facts.py", f"{_D}/nccl_floor.py"),
    "abi_libs": (f"{_D}/python_stack/abi.py", *_TORCH),
    "pcie_link": _HEALTH,
    "gpu_clocks": _HEALTH,
    "gpu_copy_bandwidth": _HEALTH,
    "gpu_peer_bandwidth": (
        f"{_D}/comm/peer.py",
        f"{_D}/comm/collectives.py",
        f"{_D}/comm/peer_bandwidth_probe.py",
        f"{_D}/comm/peer_copies.py",
        f"{_D}/gpu/load.py",
        f"{_D}/gpu/payloads.py",
        f"{_D}/node_health/verdicts.py",
        f"{_D}/gpu/nvml_health.py",
        f"{_D}/pcie/roots.py",
        f"{_D}/pcie/sysfs.py",
        f"{_D}/pcie/node.py",  # the run's PCIe facts, where the root ports come from
    ),
    "gpu_peer_stress": (
        f"{_D}/comm/pairs.py",
        f"{_D}/comm/peer.py",
        f"{_D}/comm/collectives.py",
        f"{_D}/comm/peer_stress_probe.py",
        f"{_D}/comm/peer_stress_payload.py",
        f"{_D}/comm/stress_copies.py",
        f"{_D}/comm/peer_copies.py",
        f"{_D}/gpu/load.py",
        f"{_D}/gpu/nvml_health.py",
        f"{_D}/pcie/roots.py",
        f"{_D}/pcie/sysfs.py",
        f"{_D}/pcie/node.py",  # the run's PCIe facts, where the root ports come from
    ),
    "nccl_pairs": (
        *_RANKS,
        f"{_D}/comm/pairs.py",
        f"{_D}/comm/peer.py",
        f"{_D}/pcie_p2p/nccl_pair_probe.py",
        f"{_D}/pcie_p2p/nccl_pair_payload.py",
        f"{_SRC}/doctor/stats.py",
    ),
    "topology": (
        f"{_D}/comm/collectives.py",
        f"{_D}/comm/topology_probe.py",
        f"{_D}/comm/topology_payload.py",
        f"{_SRC}/doctor/comm/topology_parse.py",
        *_PCIE[1:],  # the run's PCIe facts (IOMMU, ACS), read by the facts step
    ),
    "nccl_allreduce": (
        *_RANKS,
        f"{_D}/comm/nccl_probe.py",
        f"{_D}/comm/nccl_payload.py",
        f"{_SRC}/doctor/stats.py",
        f"{_D}/nccl_floor.py",
        f"{_D}/nccl_floor.json",
    ),
    "symm_mem": (*_RANKS, f"{_D}/comm/symm_mem_probe.py", f"{_D}/comm/symm_mem_payload.py", f"{_SRC}/doctor/stats.py"),
    "allreduce_fusion": (
        *_RANKS,
        f"{_D}/comm/fusion_probe.py",
        f"{_D}/comm/fusion_payload.py",
        f"{_SRC}/doctor/stats.py",
        f"{_SRC}/jitcache/build.py",
        *_JIT,
    ),
    "sglang_comm": (
        *_RANKS,
        f"{_D}/sglang_sm120/sglang_comm.py",
        f"{_D}/sglang_sm120/sglang_comm_probe.py",
        f"{_D}/sglang_sm120/sglang_comm_payload.py",
        f"{_D}/sglang_sm120/sglang_pcie_ipc_probe.py",
    ),
}

# Doctor checks that need no GPU (they read files, packages, the toolkit or NVRTC, or compile without a device).
CPU_CHECKS = frozenset({"platform", "manifest", "toolkit", "nvrtc", "abi_wheels", "env", "stack", "nvcc_sm120"})

# Every file in tests/gpu and scripts/device -> the files it runs (itself first).
GPU_SCRIPTS: Mapping[str, tuple[str, ...]] = {
    "tests/gpu/sglang_preflight.py": (
        "tests/gpu/sglang_preflight.py",
        f"{_D}/sglang_sm120/sglang_comm_probe.py",
        f"{_D}/sglang_sm120/sglang_comm_payload.py",
        f"{_D}/sglang_sm120/sglang_pcie_ipc_probe.py",
        f"{_SRC}/sglang",
    ),
    "tests/gpu/sglang_symm_mem.py": ("tests/gpu/sglang_symm_mem.py", f"{_SRC}/sglang"),
    "tests/gpu/test_comm_gpu.py": ("tests/gpu/test_comm_gpu.py", *_RANKS, f"{_D}/comm", f"{_D}/pcie_p2p"),
    "tests/gpu/test_doctor_gpu.py": ("tests/gpu/test_doctor_gpu.py", *_NVML, *GPU_CHECKS["sm120_jit"]),
    "tests/gpu/test_health_gpu.py": ("tests/gpu/test_health_gpu.py", *_HEALTH),
    "scripts/device/sglang_stack.py": ("scripts/device/sglang_stack.py",),
    "scripts/device/sglang_imports.py": ("scripts/device/sglang_imports.py", "scripts/device/sglang_stack.py"),
    "scripts/device/render_launch.py": ("scripts/device/render_launch.py", "roles/sglang_server"),
    "scripts/device/sglang-server.sh": (
        "scripts/device/sglang-server.sh",
        "scripts/device/sglang_stack.py",
        "tests/lab/server_pids.py",
    ),
    "scripts/device/jit_carry.py": ("scripts/device/jit_carry.py", "scripts/device/sglang_stack.py"),
    "tests/gpu/test_sglang_policy.py": (
        "tests/gpu/test_sglang_policy.py",
        "tests/lab/sglang_gpu.py",
        "tests/gpu/launch",
        f"{_SRC}/bench",
    ),
    "tests/gpu/test_sglang_switch.py": (
        "tests/gpu/test_sglang_switch.py",
        "tests/lab/sglang_gpu.py",
        "tests/gpu/launch",
        f"{_SRC}/sglang",
    ),
    "tests/gpu/test_sglang_soak.py": (
        "tests/gpu/test_sglang_soak.py",
        "tests/lab/sglang_gpu.py",
        "tests/gpu/launch",
        f"{_SRC}/soak",
        f"{_SRC}/doctor/gpu/nvml_health.py",
        f"{_SRC}/doctor/gpu/load.py",
        f"{_SRC}/doctor/child.py",
    ),
    "tests/gpu/test_sglang_envelope.py": (
        "tests/gpu/test_sglang_envelope.py",
        "tests/lab/sglang_gpu.py",
        "tests/lab/gpu_seconds.py",
        "tests/gpu/launch",
        f"{_SRC}/sglang",
        f"{_SRC}/bench",
    ),
    "tests/gpu/test_sglang_server.py": (
        "tests/gpu/test_sglang_server.py",
        "tests/lab/sglang_gpu.py",
        "tests/gpu/launch",
        "tests/lab/sglang_models.py",
        "roles/sglang_server",
        f"{_SRC}/sglang",
        f"{_SRC}/bench",
    ),
    "scripts/device/doctor-phases.py": ("scripts/device/doctor-phases.py", f"{_D}/child.py", f"{_D}/facts.py"),
    "scripts/device/flashinfer-carry.sh": ("scripts/device/flashinfer-carry.sh",),
    "scripts/device/jit-carry.sh": (
        "scripts/device/jit-carry.sh",
        "scripts/device/flashinfer-carry.sh",
        f"{_SRC}/jitcache",
    ),
    "scripts/device/node-health.sh": ("scripts/device/node-health.sh", *_HEALTH, "scripts/device/health_show.py"),
    "scripts/device/health_show.py": (
        "scripts/device/health_show.py",
        f"{_D}/node_health/verdicts.py",
        f"{_D}/node_health/sglang_configs.py",
    ),
    "scripts/device/peer-bandwidth.sh": ("scripts/device/peer-bandwidth.sh", *GPU_CHECKS["gpu_peer_bandwidth"]),
    "scripts/device/peer-self-pair.py": (
        "scripts/device/peer-self-pair.py",
        "scripts/device/pair_machinery.py",
        f"{_D}/comm/peer_copies.py",
        f"{_D}/gpu/load.py",
    ),
    "scripts/device/pair_machinery.py": (
        "scripts/device/pair_machinery.py",
        f"{_D}/comm/peer_copies.py",
        f"{_D}/comm/stress_copies.py",
        f"{_D}/gpu/load.py",
        f"{_D}/pcie_p2p/nccl_pair_probe.py",
        f"{_D}/ranks.py",
    ),
    "scripts/device/sglang-carry.sh": ("scripts/device/sglang-carry.sh",),
}
SCRIPT_DIRS = ("tests/gpu", "scripts/device")

HEADER_HELP = """\
Each record is a directory `docs/validation/<YYYY-MM-DD>-<name>/` whose `README.md` starts with this header (front
matter: `key: value` lines, list items `  - ...`, every field present, no other field):

```
---
date: 2026-12-01T17:59Z            # when the record's last run was made, UTC, no later than the commit adding it
commit: <7-40 hex>                 # the commit checked out on the device when it ran (its base, for uncommitted work)
machine: 1x H200                   # one of: 1x H200, 1x H100, 2x H200 NVLink, PCIe multi-GPU, SM120, none
gpus: 1x NVIDIA H200 (cc 9.0), driver 580.159.04
interconnect: none (one GPU)
commands:
  - python3 -m sm120check doctor --level 2 --json
result: one line: what the run showed
pytest: pytest's summary line, or not run
checks:
  - <check id or GPU script path>: <outcome>[ @<commit>]: what was seen
---
```

An outcome is `pass`, `warn`, `fail` (the check gave that verdict), `partial` (part of its code ran: say which),
`ran` (a script that has no verdict of its own ran) or `skip` (it did not run: not counted as coverage). `@<commit>`
names the commit of that one entry where it differs from the record's. List only GPU checks and GPU scripts (the rows
below). Then run `scripts/coverage_table.py` to rewrite this file; `make lint` runs it with `--check`."""

DATE_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})T(\d{2}):(\d{2})(?::(\d{2}))?Z$")
COMMIT_RE = re.compile(r"^[0-9a-f]{7,40}$")
ENTRY_RE = re.compile(r"^(?P<id>[A-Za-z0-9_./-]+): (?P<outcome>[a-z]+)(?: @(?P<commit>\S+))?: (?P<seen>\S.*)$")
DIR_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})-[a-z0-9][a-z0-9-]*$")


class CoverageError(Exception):
    """A record's header, the maps or the tree is not as the table needs; the message names the file and field."""


@dataclass(frozen=True)
class Entry:
    """One item of a header's `checks` list."""

    row: str
    outcome: str
    commit: str  # the entry's own commit, or the record's
    seen: str


@dataclass(frozen=True)
class Header:
    path: str  # relative to the repository root
    date: dt.datetime
    commit: str
    machine: str
    gpus: str
    interconnect: str
    commands: tuple[str, ...]
    result: str
    pytest: str
    checks: tuple[Entry, ...]


@dataclass(frozen=True)
class Cell:
    record: str  # the record directory's name
    date: dt.date
    outcome: str
    changed: bool


@dataclass(frozen=True)
class Row:
    row: str
    kind: str  # "check L<level>" or "script"
    cells: tuple[Cell | None, ...]  # one per MACHINES entry
    skipped: tuple[str | None, ...]  # per machine: the latest record that only skipped it, where none ran it


def _front_matter(text: str, path: str) -> list[str]:
    lines = text.split("\n")
    if not lines or lines[0] != "---":
        raise CoverageError(f"{path}: no header: the file must start with a '---' line (fields: {', '.join(FIELDS)})")
    try:
        end = lines.index("---", 1)
    except ValueError:
        raise CoverageError(f"{path}: header not closed: no second '---' line") from None
    return lines[1:end]


def _fields(lines: Sequence[str], path: str) -> dict[str, str | list[str]]:
    fields: dict[str, str | list[str]] = {}
    current: list[str] | None = None
    for number, line in enumerate(lines, start=2):
        if line.startswith("  - "):
            if current is None:
                raise CoverageError(f"{path}: header line {number}: a list item outside a list field")
            current.append(line[4:].strip())
            continue
        key, sep, value = line.partition(":")
        if not sep or not re.fullmatch(r"[a-z]+", key):
            raise CoverageError(f"{path}: header line {number}: not 'field: value' or '  - item': {line!r}")
        if key not in FIELDS:
            raise CoverageError(f"{path}: header line {number}: unknown field {key!r} (fields: {', '.join(FIELDS)})")
        if key in fields:
            raise CoverageError(f"{path}: header field {key!r} given twice")
        value = value.strip()
        if key in LIST_FIELDS:
            if value:
                raise CoverageError(f"{path}: header field {key!r} is a list: put its items on '  - ' lines")
            current = []
            fields[key] = current
        else:
            if not value:
                raise CoverageError(f"{path}: header field {key!r} is empty")
            current = None
            fields[key] = value
    for key in FIELDS:
        if key not in fields:
            raise CoverageError(f"{path}: header field {key!r} missing")
    return fields


def _text(fields: Mapping[str, str | list[str]], key: str) -> str:
    value = fields[key]
    assert isinstance(value, str)
    return value


def _items(fields: Mapping[str, str | list[str]], key: str) -> tuple[str, ...]:
    value = fields[key]
    assert isinstance(value, list)
    return tuple(value)


def parse_date(value: str, path: str) -> dt.datetime:
    match = DATE_RE.match(value)
    if match is None:
        raise CoverageError(f"{path}: header field 'date': {value!r} is not YYYY-MM-DDTHH:MM[:SS]Z (UTC)")
    day, hour, minute, second = match.groups()
    try:
        return dt.datetime.fromisoformat(f"{day}T{hour}:{minute}:{second or '00'}+00:00")
    except ValueError as exc:
        raise CoverageError(f"{path}: header field 'date': {value!r}: {exc}") from None


def parse_header(text: str, path: str, known_rows: Iterable[str]) -> Header:
    """The header of one record (strict: every field, no other, known rows only); raises CoverageError."""
    fields = _fields(_front_matter(text, path), path)
    date = parse_date(_text(fields, "date"), path)
    commit = _text(fields, "commit")
    if not COMMIT_RE.match(commit):
        raise CoverageError(f"{path}: header field 'commit': {commit!r} is not 7-40 lowercase hex digits")
    machine = _text(fields, "machine")
    if machine not in MACHINE_KINDS:
        raise CoverageError(f"{path}: header field 'machine': {machine!r} is not one of {', '.join(MACHINE_KINDS)}")
    commands = _items(fields, "commands")
    if not commands:
        raise CoverageError(f"{path}: header field 'commands' has no items")
    rows = frozenset(known_rows)
    entries: list[Entry] = []
    for item in _items(fields, "checks"):
        match = ENTRY_RE.match(item)
        if match is None:
            raise CoverageError(
                f"{path}: header field 'checks': {item!r} is not '<row>: <outcome>[ @<commit>]: <seen>'"
            )
        row, outcome = match["id"], match["outcome"]
        if row not in rows:
            raise CoverageError(f"{path}: header field 'checks': {row!r} is not a GPU check or GPU script")
        if outcome not in OUTCOMES:
            raise CoverageError(f"{path}: header field 'checks': {row}: outcome {outcome!r} not one of {OUTCOMES}")
        own = match["commit"] or commit
        if not COMMIT_RE.match(own):
            raise CoverageError(f"{path}: header field 'checks': {row}: {own!r} is not a commit")
        if any(e.row == row for e in entries):
            raise CoverageError(f"{path}: header field 'checks': {row} listed twice")
        entries.append(Entry(row, outcome, own, match["seen"]))
    if machine != "none" and not entries:
        raise CoverageError(f"{path}: header field 'checks' has no items (a GPU record exercised something)")
    return Header(
        path=path,
        date=date,
        commit=commit,
        machine=machine,
        gpus=_text(fields, "gpus"),
        interconnect=_text(fields, "interconnect"),
        commands=commands,
        result=_text(fields, "result"),
        pytest=_text(fields, "pytest"),
        checks=tuple(entries),
    )


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)


def commit_time(root: Path, commit: str, path: str, field: str) -> dt.datetime:
    done = _git(root, "log", "-1", "--format=%cI", f"{commit}^{{commit}}", "--")
    if done.returncode != 0 or not done.stdout.strip():
        raise CoverageError(f"{path}: header field {field!r}: commit {commit} is not in this repository's history")
    return dt.datetime.fromisoformat(done.stdout.strip())


def check_dates(root: Path, header: Header) -> None:
    """The run came after its commit existed, and before the record was (last) committed."""
    run_commit = commit_time(root, header.commit, header.path, "commit")
    if header.date < run_commit.replace(second=0):
        raise CoverageError(
            f"{header.path}: header field 'date': {header.date:%Y-%m-%dT%H:%MZ} is before its commit "
            f"{header.commit[:12]} ({run_commit.isoformat()})"
        )
    for entry in header.checks:
        if entry.commit != header.commit:
            commit_time(root, entry.commit, header.path, f"checks: {entry.row}")
    done = _git(root, "log", "-1", "--format=%cI", "HEAD", "--", header.path)
    added = done.stdout.strip()
    if added and header.date > dt.datetime.fromisoformat(added):
        raise CoverageError(
            f"{header.path}: header field 'date': {header.date:%Y-%m-%dT%H:%MZ} is later than the commit "
            f"that records it ({added})"
        )


def changed_since(root: Path, commit: str, files: Sequence[str]) -> bool:
    """Whether HEAD's history after `commit`, or the working tree, changed any of `files`."""
    log = _git(root, "log", "-1", "--format=%H", f"{commit}..HEAD", "--", *files)
    if log.returncode != 0:
        raise CoverageError(f"git log {commit}..HEAD failed: {log.stderr.strip()}")
    if log.stdout.strip():
        return True
    diff = _git(root, "diff", "--quiet", "HEAD", "--", *files)
    return diff.returncode != 0


def catalogue() -> list[tuple[str, int]]:
    """(id, level) of every doctor check, in report order."""
    src = str(ROOT / "python/sm120check/src")
    if src not in sys.path:
        sys.path.insert(0, src)
    from sm120check.doctor.catalogue import all_checks

    return [(c.id, c.level) for c in all_checks()]


def gpu_check_rows(checks: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """The catalogue's GPU checks; an id in neither map, or a map entry the catalogue lacks, is an error."""
    ids = {cid for cid, _ in checks}
    unknown = [cid for cid, _ in checks if cid not in GPU_CHECKS and cid not in CPU_CHECKS]
    if unknown:
        raise CoverageError(
            f"scripts/coverage_table.py: check(s) {', '.join(unknown)} in neither GPU_CHECKS nor CPU_CHECKS: "
            "say which files each runs (GPU_CHECKS) or that it needs no GPU (CPU_CHECKS)"
        )
    gone = sorted((set(GPU_CHECKS) | CPU_CHECKS) - ids)
    if gone:
        raise CoverageError(f"scripts/coverage_table.py: GPU_CHECKS/CPU_CHECKS name check(s) the doctor lacks: {gone}")
    gpu = [(cid, level) for cid, level in checks if cid in GPU_CHECKS]
    return sorted(gpu, key=lambda c: c[1])  # by level, then report order (the sort is stable)


def script_rows(root: Path) -> list[str]:
    found = sorted(
        f"{d}/{p.name}" for d in SCRIPT_DIRS for p in (root / d).iterdir() if p.is_file() and not p.name.startswith(".")
    )
    unknown = [s for s in found if s not in GPU_SCRIPTS]
    if unknown:
        raise CoverageError(f"scripts/coverage_table.py: GPU script(s) {', '.join(unknown)} not in GPU_SCRIPTS")
    gone = sorted(set(GPU_SCRIPTS) - set(found))
    if gone:
        raise CoverageError(f"scripts/coverage_table.py: GPU_SCRIPTS names file(s) that do not exist: {gone}")
    return found


def check_sources(root: Path) -> None:
    for row, files in (*GPU_CHECKS.items(), *GPU_SCRIPTS.items()):
        for f in files:
            if not (root / f).exists():
                raise CoverageError(f"scripts/coverage_table.py: {row} runs {f}, which does not exist")


def read_utf8(file: Path, shown: str) -> str:
    """The file's text; CoverageError naming the line and the fix when it is not UTF-8."""
    raw = file.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise CoverageError(
            f"{shown}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); convert the file to UTF-8 "
            "(e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`)"
        ) from None


def read_records(root: Path, known_rows: Iterable[str]) -> list[Header]:
    rows = list(known_rows)
    headers: list[Header] = []
    base = root / VALIDATION
    for d in sorted(p for p in base.iterdir() if p.is_dir()):
        path = f"{VALIDATION}/{d.name}/README.md"
        match = DIR_RE.match(d.name)
        if match is None:
            raise CoverageError(f"{VALIDATION}/{d.name}: a record directory is named <YYYY-MM-DD>-<name>")
        if not (d / "README.md").is_file():
            raise CoverageError(f"{path}: missing (every record directory has a README.md with a header)")
        header = parse_header(read_utf8(d / "README.md", path), path, rows)
        if header.date.date().isoformat() < match[1]:
            raise CoverageError(f"{path}: header field 'date': {header.date:%Y-%m-%d} is before the directory's date")
        check_dates(root, header)
        headers.append(header)
    return headers


def build_rows(
    root: Path, checks: Sequence[tuple[str, int]], scripts: Sequence[str], records: Sequence[Header]
) -> list[Row]:
    rows: list[Row] = []
    wanted: list[tuple[str, str, tuple[str, ...]]] = [
        *((cid, f"check, level {level}", GPU_CHECKS[cid]) for cid, level in checks),
        *((s, "script", GPU_SCRIPTS[s]) for s in scripts),
    ]
    ordered = sorted(records, key=lambda h: (h.date, h.path), reverse=True)
    for row, kind, files in wanted:
        cells: list[Cell | None] = []
        skipped: list[str | None] = []
        for machine in MACHINES:
            cell: Cell | None = None
            skip: str | None = None
            for header in ordered:
                if header.machine != machine:
                    continue
                entry = next((e for e in header.checks if e.row == row), None)
                if entry is None:
                    continue
                name = Path(header.path).parent.name
                if entry.outcome in RAN:
                    cell = Cell(name, header.date.date(), entry.outcome, changed_since(root, entry.commit, files))
                    break
                skip = skip or name
            cells.append(cell)
            skipped.append(None if cell else skip)
        rows.append(Row(row, kind, tuple(cells), tuple(skipped)))
    return rows


def _cell_text(cell: Cell | None, skipped: str | None) -> str:
    if cell is None:
        return f"never (skipped: [{skipped[:10]}]({skipped}/README.md))" if skipped else "never"
    stale = " (code changed since)" if cell.changed else ""
    return f"[{cell.date.isoformat()}]({cell.record}/README.md) {cell.outcome}{stale}"


def render(rows: Sequence[Row], records: Sequence[Header]) -> str:
    out = [
        "# Validation records: what ran on which GPUs",
        "",
        "<!-- generated by scripts/coverage_table.py from the headers of docs/validation/*/README.md: do not edit -->",
        "",
        "One row per doctor check that reads or needs a GPU and per GPU script (tests/gpu, scripts/device); one column",
        "per machine class. A cell is the latest record on that class where the row's code ran, its outcome, and",
        "`(code changed since)` where a file the row runs changed after the record's commit. `never`: no record",
        "ran it there (`skipped`: a record where it only skipped). `partial`: part of its code ran (the record says",
        "which).",
        "",
        f"| row | kind | {' | '.join(MACHINES)} |",
        f"| --- | --- |{' --- |' * len(MACHINES)}",
    ]
    for row in rows:
        cells = " | ".join(_cell_text(c, s) for c, s in zip(row.cells, row.skipped, strict=True))
        out.append(f"| `{row.row}` | {row.kind} | {cells} |")
    out += [
        "",
        "## Records",
        "",
        "| record | date (UTC) | commit | machine | result |",
        "| --- | --- | --- | --- | --- |",
    ]
    for h in sorted(records, key=lambda h: (h.date, h.path)):
        name = Path(h.path).parent.name
        result = h.result.replace("|", "\\|")
        out.append(
            f"| [{name}]({name}/README.md) | {h.date:%Y-%m-%d %H:%M} | {h.commit[:9]} | {h.machine} | {result} |"
        )
    out += ["", "## Adding a record", "", HEADER_HELP, ""]
    return "\n".join(out)


def generate(root: Path) -> str:
    checks = gpu_check_rows(catalogue())
    scripts = script_rows(root)
    check_sources(root)
    records = read_records(root, [*(cid for cid, _ in checks), *scripts])
    return render(build_rows(root, checks, scripts, records), records)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help=f"exit 1 when {TABLE} is stale or a header is invalid")
    args = parser.parse_args(argv)
    try:
        text = generate(ROOT)
    except CoverageError as exc:
        print(f"coverage_table: {exc}", file=sys.stderr)
        return 1
    target = ROOT / TABLE
    if args.check:
        try:
            current = read_utf8(target, TABLE) if target.exists() else ""
        except CoverageError as exc:
            print(f"coverage_table: {exc}", file=sys.stderr)
            return 1
        if current != text:
            print(f"coverage_table: {TABLE} is stale: run scripts/coverage_table.py", file=sys.stderr)
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
