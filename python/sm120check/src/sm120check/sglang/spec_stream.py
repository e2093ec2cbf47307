"""The speculative histograms only with a request's last output (`sglang patch --plain-decode` applies it with the
switch): SGLang's output streamer (`srt/managers/scheduler_components/output_streamer.py`) appends every running
request's two speculative histograms (correct drafts and cap lengths per step count) to every decode step's output,
and the detokenizer forwards them to the HTTP process, which reads them only when the request finishes
(`TokenizerManager._calculate_spec_decoding_metrics`). The edit appends the empty tuple for a request that has not
finished: one shared object, which pickle writes as one opcode and the reader gets back without an allocation (a new
empty list a request, the edit's first version, still cost two containers a request on every step). Readers test the
entry before they use it, so `()` reads as no histogram. A finished request's output is unchanged. The four
per-request counters stay in every output (ints, and their readers index them whatever the state)."""

from __future__ import annotations

from sm120check.sglang.errors import SglangError
from sm120check.sglang.plain_decode import SwitchScan
from sm120check.sglang.textedit import MARK

PATCH_ID = "spec-stream"
PATH = "srt/managers/scheduler_components/output_streamer.py"
SUPPORTED = ("0.5.16", "0.5.23")
FIELDS = ("spec_correct_drafts_histogram", "spec_cap_lens_histogram")
_EDIT_NOTE = f"{MARK}: sent only with a request's last output"


def _anchor(field: str) -> str:
    return f"self.{field}.append(req.{field})"


def _edited(field: str, empty: str = "()") -> str:
    return f"self.{field}.append(req.{field} if req.finished() else {empty})  {_EDIT_NOTE}"


def applied(text: str) -> bool:
    return all(_edited(f) in text for f in FIELDS)


def earlier(text: str) -> bool:
    """The edit's first version (a new empty list a request) is in the streamer."""
    return not applied(text) and any(_edited(f, "[]") in text for f in FIELDS)


EARLIER = (
    "an earlier version of the speculative-stream edit is in this tree (a new empty list a request); "
    "run `sm120check sglang patch --revert`, then patch again with --plain-decode"
)


def _lines(text: str) -> list[tuple[int, int, str]]:
    """(start, end, indent) of each anchor line in FIELDS order; SglangError naming one not found exactly once."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    found = []
    for field in FIELDS:
        anchor = _anchor(field)
        hits = [i for i, line in enumerate(lines) if line.strip() == anchor]
        if len(hits) != 1:
            how = "not found" if not hits else f"found {len(hits)} times"
            raise SglangError(f"{PATH}: `{anchor}` {how}; the speculative-stream edit does not apply to this tree")
        body = lines[hits[0]].rstrip("\r\n")
        found.append((starts[hits[0]], starts[hits[0]] + len(body), body[: len(body) - len(body.lstrip())]))
    return found


def survey(text: str | None, version: str) -> SwitchScan:
    if text is None:
        return SwitchScan(PATH, False, False, f"{PATH} not found (no output streamer in this release)")
    if applied(text):
        return SwitchScan(PATH, True, True, "")
    if earlier(text):
        return SwitchScan(PATH, True, False, EARLIER)
    if version not in SUPPORTED:
        why = f"SGLang {version} is not a release the speculative-stream edit was written against"
        return SwitchScan(PATH, False, False, f"{why} ({', '.join(SUPPORTED)})")
    try:
        _lines(text)
    except SglangError as exc:
        return SwitchScan(PATH, True, False, str(exc))
    return SwitchScan(PATH, True, False, "")


def add(text: str, version: str) -> str:
    """The streamer's source with the edit (unchanged when it is there already); SglangError when it cannot apply."""
    if applied(text):
        return text
    if earlier(text):
        raise SglangError(f"{PATH}: {EARLIER}")
    if version not in SUPPORTED:
        raise SglangError(
            f"SGLang {version}: the speculative-stream edit is written for {', '.join(SUPPORTED)} only; "
            "patch without --plain-decode, or install one of those releases"
        )
    for (start, end, indent), field in sorted(zip(_lines(text), FIELDS, strict=True), reverse=True):
        text = text[:start] + indent + _edited(field) + text[end:]
    return text
