"""One exit-status enum for every command: 0 ok, 1 something found, 2 could not run, 128 + N a signal."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import sm120check
from sm120check.exitcodes import Exit

PACKAGE = Path(sm120check.__file__).parent


def test_the_statuses_keep_their_documented_numbers() -> None:
    assert (Exit.OK, Exit.FOUND, Exit.USAGE) == (0, 1, 2)
    assert (Exit.INTERRUPTED, Exit.TERMINATED) == (130, 143)
    assert Exit.signalled(signal.SIGTERM) == Exit.TERMINATED


def test_no_command_declares_its_own_exit_codes_or_returns_bare_numbers() -> None:
    own = re.compile(r"^EXIT_\w+(?:\s*,\s*EXIT_\w+)*\s*=", re.MULTILINE)
    bare = re.compile(r"^\s+return (?:[0-9]+|1[0-9]{2} *\+.*)$", re.MULTILINE)
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*cli.py"))
        if own.search(path.read_text(encoding="utf-8")) or bare.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], "use sm120check.exitcodes.Exit"
