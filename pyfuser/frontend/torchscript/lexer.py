"""Character scanner for TorchScript IR text: positions, whitespace/comments, small tokens.

The IR is not whitespace sensitive (statements are recognised by their first token), so the
scanner skips spaces, newlines and `#` comments everywhere. A comment's continuation lines
(PyTorch's multi-line source highlights: the source text, then `~~~~ <--- HERE`) are skipped
too: after a comment, a line that cannot start an IR statement or header item (first
character not one of `%`, `-`, `=`, `)`, `#`, and not `return (`/`block<N>`/`with`/`graph`) is
treated as part of the comment. Fuser debug-log prefixes such as `[DUMP graph_fuser.cpp:12] `
are blanked out (replaced by spaces, so columns stay right) together with any log lines before
the first `graph(`.

Every error goes through `Scanner.error`, which builds IRParseError(message, line, column,
source_line) with 1-based line and column; `expect` names what was expected and what was found.
"""
from __future__ import annotations

import bisect
import re
from typing import Optional

from pyfuser.errors import IRParseError

_WS = re.compile(r"[ \t\r\n\f\v]+")
_LOG_PREFIX = re.compile(r"^\[(?:DUMP|DEBUG|UPDATE|GRAPH_[A-Z]+|INFO)[^\]\n]*\] ?", re.M)
_STMT_START = re.compile(r"[ \t]*(?:[%\-=)#]|return\s*\(|block\d|with\b|graph\b)")
_TOKEN_PREVIEW = re.compile(r"%?[A-Za-z0-9_.:]+|\S")

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
KIND = re.compile(r"[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_0-9][A-Za-z0-9_.]*")
VALUE = re.compile(r"%([A-Za-z0-9_][A-Za-z0-9_.]*)")
INT = re.compile(r"-?\d+")
NUMBER = re.compile(r"-?(?:inf\b|nan\b|\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)")
BLOCK = re.compile(r"block(\d+)\b")
MAX_NESTING = 64


def _blank_log_prefixes(text: str) -> str:
    if not _LOG_PREFIX.search(text):
        return text
    text = _LOG_PREFIX.sub(lambda m: " " * len(m.group(0)), text)
    m = re.search(r"^[ \t]*graph\(", text, re.M)
    if m:
        head = text[:m.start()]
        text = re.sub(r"[^\n]", " ", head) + text[m.start():]
    return text


class Scanner:
    def __init__(self, text: str, filename: str = "<string>"):
        self.text = _blank_log_prefixes(text.expandtabs(1) if "\t" in text else text)
        self.filename = filename
        self.pos = 0
        self.depth = 0                        # nesting of types / attribute values
        self._line_starts = [0] + [m.end() for m in re.finditer(r"\n", self.text)]

    # ----- positions and errors ----------------------------------------------------------
    def loc(self, pos: Optional[int] = None) -> tuple[int, int]:
        pos = self.pos if pos is None else min(pos, len(self.text))
        line = bisect.bisect_right(self._line_starts, pos)
        return line, pos - self._line_starts[line - 1] + 1

    def line_text(self, line: int) -> str:
        start = self._line_starts[line - 1]
        end = self.text.find("\n", start)
        return self.text[start:] if end < 0 else self.text[start:end]

    def error(self, message: str, pos: Optional[int] = None) -> IRParseError:
        line, col = self.loc(pos)
        err = IRParseError(message, line, col, self.line_text(line).rstrip())
        err.filename = self.filename
        return err

    def found(self) -> str:
        self.skip()
        if self.pos >= len(self.text):
            return "end of input"
        m = _TOKEN_PREVIEW.match(self.text, self.pos)
        return f"`{m.group(0)[:24]}`"

    def nest(self, what: str, extra: int = 0) -> None:
        """Count one level of nesting; types and values deeper than MAX_NESTING are errors."""
        self.depth += 1
        if self.depth + extra > MAX_NESTING:
            raise self.error(f"{what} nested more than {MAX_NESTING} levels deep")

    # ----- skipping ----------------------------------------------------------------------
    def skip(self) -> None:
        text, n = self.text, len(self.text)
        while self.pos < n:
            m = _WS.match(text, self.pos)
            if m:
                self.pos = m.end()
                continue
            if text[self.pos] != "#":
                return
            self.pos = self._skip_comment(self.pos)

    def _skip_comment(self, pos: int) -> int:
        """Skip a comment from `pos` and its continuation lines; returns the new position."""
        while True:
            nl = self.text.find("\n", pos)
            if nl < 0:
                return len(self.text)
            nxt = nl + 1
            while True:                       # skip blank lines
                end = self.text.find("\n", nxt)
                line = self.text[nxt:] if end < 0 else self.text[nxt:end]
                if line.strip() or end < 0:
                    break
                nxt = end + 1
            if not line.strip() or _STMT_START.match(line):
                return nxt
            pos = nxt                          # a continuation line of the comment

    def rest_of_line(self) -> str:
        """Consume raw text up to (not including) a `#` comment or the end of the line."""
        end = self.text.find("\n", self.pos)
        end = len(self.text) if end < 0 else end
        hash_ = self.text.find("#", self.pos, end)
        stop = end if hash_ < 0 else hash_
        s = self.text[self.pos:stop]
        self.pos = stop
        return s.strip()

    # ----- tokens ------------------------------------------------------------------------
    def at_eof(self) -> bool:
        self.skip()
        return self.pos >= len(self.text)

    def peek(self, lit: str) -> bool:
        self.skip()
        return self.text.startswith(lit, self.pos)

    def peek_char(self) -> str:
        self.skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def accept(self, lit: str) -> bool:
        if self.peek(lit):
            self.pos += len(lit)
            return True
        return False

    def expect(self, lit: str, context: str = "") -> int:
        """Consume `lit`; returns its position. Raises naming what was expected."""
        if not self.peek(lit):
            where = f" {context}" if context else ""
            raise self.error(f"expected `{lit}`{where}, found {self.found()}")
        start = self.pos
        self.pos += len(lit)
        return start

    def match(self, regex: re.Pattern) -> Optional[re.Match]:
        self.skip()
        m = regex.match(self.text, self.pos)
        if m:
            self.pos = m.end()
        return m

    def peek_match(self, regex: re.Pattern) -> Optional[re.Match]:
        self.skip()
        return regex.match(self.text, self.pos)

    def expect_match(self, regex: re.Pattern, what: str) -> re.Match:
        m = self.match(regex)
        if not m:
            raise self.error(f"expected {what}, found {self.found()}")
        return m

    def keyword(self, word: str) -> bool:
        """Accept `word` only as a whole identifier."""
        m = self.peek_match(IDENT)
        if m and m.group(0) == word:
            self.pos = m.end()
            return True
        return False
