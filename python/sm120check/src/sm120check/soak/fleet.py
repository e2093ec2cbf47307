"""The fleet's soaks: each node's soak verdict, and the nodes whose clocks or tokens/s sit below the fleet's median
for the same GPU model (fleet/outliers.judge, the doctor fleet's own rule).

Input: each node's soak.json (the doctor's report format, read by fleet/load.parse_document and DoctorReport).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sm120check import bounded
from sm120check.doctor.document import DoctorReport, ReportResult
from sm120check.doctor.model import Status
from sm120check.doctor.payload import PayloadError
from sm120check.fleet.load import MAX_NODE_BYTES, NodeDocumentError, parse_document
from sm120check.fleet.outliers import Figure, Review, Thresholds, judge

CLOCKS, TOKENS = "soak_clocks.sm_mhz_median", "soak_throughput.tokens_per_s_median"
# our choice: a clock 5 % or a throughput 10 % below the median of the same GPU model is an outlier
LIMITS = Thresholds(((CLOCKS, 0.05), (TOKENS, 0.10)))
_RANK = {Status.FAIL: 3, Status.WARN: 2, Status.PASS: 1, Status.SKIP: 0}


@dataclass(frozen=True)
class SoakNode:
    host: str
    status: Status  # the worst verdict; FAIL too when the report could not be read
    findings: tuple[str, ...]  # "soak_server: the server died ..." for each verdict that did not pass
    error: str = ""


@dataclass(frozen=True)
class SoakFleet:
    nodes: tuple[SoakNode, ...]
    review: Review

    @property
    def failed(self) -> bool:
        return any(n.status is Status.FAIL for n in self.nodes)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def figures(host: str, results: Sequence[ReportResult]) -> list[Figure]:
    """A node's SM clock medians per GPU and its tokens/s median, keyed by GPU model."""
    by_id = {r.id: r for r in results}
    clocks = by_id.get("soak_clocks")
    found: list[Figure] = []
    models: Mapping[str, object] = {}
    if clocks is not None:
        raw_models = clocks.data.get("models")
        models = raw_models if isinstance(raw_models, Mapping) else {}
        medians = clocks.data.get("sm_mhz_median")
        for gpu, value in medians.items() if isinstance(medians, Mapping) else []:
            mhz = _number(value)
            if mhz is not None and str(gpu).isdigit():
                found.append(Figure(host, int(gpu), CLOCKS, mhz, "MHz", "higher", str(models.get(gpu, "")) or "?"))
    throughput = by_id.get("soak_throughput")
    tokens = _number(throughput.data.get("tokens_per_s_median")) if throughput is not None else None
    if tokens is not None:
        model = " + ".join(sorted({str(m) for m in models.values() if m})) or "?"
        found.append(Figure(host, None, TOKENS, tokens, "tok/s", "higher", model))
    return found


def node(host: str, report: DoctorReport) -> SoakNode:
    results = [r for r in report.results if r.id.startswith("soak_")]
    worst = max((r.status for r in results), key=lambda s: _RANK[s], default=Status.SKIP)
    findings = tuple(f"{r.id}: {r.summary}" for r in results if r.status in (Status.FAIL, Status.WARN))
    return SoakNode(host, worst, findings)


def view(reports: Mapping[str, DoctorReport], errors: Mapping[str, str] | None = None) -> SoakFleet:
    nodes = [node(host, r) for host, r in sorted(reports.items())]
    nodes += [SoakNode(host, Status.FAIL, (), error) for host, error in sorted((errors or {}).items())]
    found = [f for host, r in sorted(reports.items()) for f in figures(host, r.results)]
    return SoakFleet(tuple(nodes), judge(found, limits=LIMITS))


def load(paths: Iterable[Path]) -> SoakFleet:
    """Each path a node's soak.json, or a folder of <host>.json / <host>/soak.json; the host is the report's."""
    reports: dict[str, DoctorReport] = {}
    errors: dict[str, str] = {}
    for path in _files(paths):
        try:
            text = bounded.read_text(path, MAX_NODE_BYTES)
            report = DoctorReport.from_json(parse_document(text))
        except (bounded.Unreadable, NodeDocumentError, PayloadError, OSError) as exc:
            errors[str(path)] = str(exc)
            continue
        reports[report.host or path.stem] = report
    return view(reports, errors)


def _files(paths: Iterable[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(path.glob("*.json")) + sorted(path.glob("*/soak.json"))
        else:
            found.append(path)
    return found


def render(fleet: SoakFleet) -> str:
    lines = ["NODE  SOAK  FINDINGS"]
    for n in fleet.nodes:
        said = n.error or "; ".join(n.findings) or "-"
        lines.append(f"{n.host}  {n.status.value.upper()}  {said}")
    if fleet.review.outliers:
        lines.append("below the fleet median for the same GPU model:")
        for o in fleet.review.outliers:
            f = o.figure
            gpu = f"GPU {f.gpu} " if f.gpu is not None else ""
            where = f"{f.node} {gpu}{f.metric}"
            lines.append(f"  {where} {f.value:g} {f.unit} vs median {o.median:g} ({o.deviation:+.0%}, {f.model})")
    too_few = fleet.review.too_few
    if too_few:
        lines.append(
            "not compared (fewer than 3 nodes of a model): " + ", ".join(f"{g.group} {g.metric}" for g in too_few)
        )
    return "\n".join(lines)
