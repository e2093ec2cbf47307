"""Write to stdout where the reader may have gone (`| head`, `| true`): a closed pipe is not a traceback."""

from __future__ import annotations

import contextlib
import os
import sys


def write_stdout(text: str) -> str:
    """Print the report; "" when done or when the reader is gone (a closed pipe is harmless: the files are written),
    else why stdout could not take it (closed, full). Never raises."""
    stream = sys.stdout
    if stream is None:
        return "stdout is closed"
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        silence_stdout()
        return ""
    except (OSError, ValueError) as exc:
        silence_stdout()
        return f"cannot write to stdout: {getattr(exc, 'strerror', None) or exc}"
    return ""


def silence_stdout() -> None:
    """Point stdout's descriptor at /dev/null, so the interpreter's last flush does not fail again (which would
    print a traceback and exit 120)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
