"""Text read from files, sockets or REST replies, made safe to show on a terminal.

A string that another user could have written (a run directory's files, a socket's
reply, a controller's error) may carry terminal escape sequences: ESC [ ... that move
the cursor, rewrite earlier lines, set the window title or, on some terminals, answer
back into the input. Before the CLI prints such a string, every control character is
replaced by a visible escape (`\\u001b`), and so are the Unicode characters that reorder
or break what a reader sees (bidirectional overrides and isolates, line and paragraph
separators). The escape is also valid inside a JSON string, so JSON output stays JSON.
"""

from __future__ import annotations

import logging
import re

# C0 controls except tab and newline, DEL, C1 controls (0x9b is a one-byte CSI on some
# terminals), and the invisible reordering and separator characters.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e"
                     "\u2066-\u2069]")
# The same with newline and tab: for text that must stay on one line.
_UNSAFE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e"
                          "\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    ch = m.group()
    return _NAMED.get(ch) or f"\\u{ord(ch):04x}"


def safe_text(text: str) -> str:
    """`text` with every control character but newline and tab made visible."""
    return _UNSAFE.sub(_escape, text)


def safe_line(text: str) -> str:
    """`text` on one line: newlines, tabs and every other control character made
    visible."""
    return _UNSAFE_LINE.sub(_escape, text)


def is_safe(text: str) -> bool:
    """Whether `text` holds nothing that safe_text would escape."""
    return _UNSAFE.search(text) is None


class SafeFormatter(logging.Formatter):
    """A log formatter whose output carries no terminal control characters (a log
    message may quote a file's or a peer's text)."""

    def format(self, record: logging.LogRecord) -> str:
        return safe_text(super().format(record))
