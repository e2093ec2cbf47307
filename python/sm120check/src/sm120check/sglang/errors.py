"""Errors that end a scan or patch with exit status 2, each naming what was wrong and the fix."""

from __future__ import annotations


class SglangError(Exception):
    """A problem with the target or the arguments; the message names the bad value and the fix."""


class Refusal(SglangError):
    """The release does not look like any release this tool understands: change nothing, say where."""

    def __init__(self, path: str, anchor: str, reason: str) -> None:
        self.path = path
        self.anchor = anchor
        self.reason = reason
        super().__init__(
            f"refusing to touch this SGLang release: {path}: {anchor}: {reason}. Nothing was changed; "
            "this release differs from the ones sm120check understands, so patch it by hand or upgrade sm120check."
        )
