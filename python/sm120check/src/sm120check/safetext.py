"""Text from probes, nodes and servers made safe for the formats it is written into.

Probe output carries ANSI colour codes and stray control characters (compilers, Python tools); host names and check
text of a fleet come from files anyone can write. XML 1.0 forbids most control characters (a document with a NUL is
not well-formed, and CI rejects the whole report), and a terminal interprets escape sequences. These functions keep
the text readable and make it inert: ANSI sequences are removed, other forbidden characters are written as visible
escapes (`\\x00`), so the evidence is kept.
"""

from __future__ import annotations

import re

# CSI (colours, cursor moves), OSC (titles, hyperlinks; ended by BEL or ST), and the two-byte escapes.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]|\x9b[0-?]*[ -/]*[@-~]")
# Characters XML 1.0 does not allow anywhere (section 2.2): C0 controls but tab, LF, CR; surrogates; U+FFFE, U+FFFF.
_XML_FORBIDDEN = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# What a terminal line should not get: every C0 and C1 control, DEL (newline and tab handled by the caller's mode),
# and the invisible format characters that reorder or hide text (bidi overrides and isolates, zero-width ones).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def xml_text(text: object) -> str:
    """Text that XML 1.0 accepts in element content and attributes: ANSI removed, forbidden characters escaped."""
    return _XML_FORBIDDEN.sub(_visible, strip_ansi(str(text)))


def terminal_text(text: object, one_line: bool = False) -> str:
    """Text without ANSI sequences or control characters (escaped visibly); one_line also escapes newlines and tabs.

    The one function for text from outside (Xid process names, host names, server versions, file names, logs) on
    its way to a terminal: every text render and error line of the tools passes through it."""
    cleaned = _CONTROL.sub(_visible, strip_ansi(str(text)))
    if one_line:
        cleaned = cleaned.replace("\r", "\\r").replace("\n", "\\n").replace("\t", " ")
    return cleaned
