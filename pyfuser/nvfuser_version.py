"""`pyfuser.nvfuser_version`: `version()` and `Version`, as nvFuser's `nvfuser.nvfuser_version`.

`version()` is pyfuser's version (pyfuser.__version__) as a Version, which compares with another
Version or a version string by its numeric release parts ("0.1.0" > "0.0.9", "0.1" == "0.1.0")."""
from __future__ import annotations

import functools
import re


@functools.total_ordering
class Version:
    def __init__(self, text):
        text = str(text)
        m = re.match(r"\s*v?(\d+(?:\.\d+)*)", text)
        if m is None:
            raise ValueError(f"not a version: {text!r}")
        self.text = text
        parts = [int(p) for p in m.group(1).split(".")]
        while len(parts) > 1 and parts[-1] == 0:
            parts.pop()
        self.release = tuple(parts)

    @staticmethod
    def _of(other) -> "Version":
        return other if isinstance(other, Version) else Version(other)

    def __eq__(self, other) -> bool:
        try:
            return self.release == self._of(other).release
        except ValueError:
            return NotImplemented

    def __lt__(self, other) -> bool:
        return self.release < self._of(other).release

    def __hash__(self) -> int:
        return hash(self.release)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Version({self.text!r})"


def version() -> Version:
    from . import __version__
    return Version(__version__)
