"""Progress of long work (`pyfuser demo`, the benchmarks): a bar in a terminal, lines when piped.

    for case in track(CASES, "pointwise", name=lambda c: c[0]):
        ...                                   # prints inside the loop stay readable

In a terminal (the progress stream is a TTY) one status line is kept at the bottom of the
screen on stderr, `label [#####-----] 3/10 0:12 ~0:08 left  what`, redrawn as items start and
end; while it is shown, sys.stdout and sys.stderr go through a wrapper that clears the line
before any other output and draws it again after each complete line, so the loop's own prints
scroll above it. Piped (not a TTY) it writes plain lines to stderr instead: `[3/10] label: what`
as each item starts, and a last line with the total time. `PYFUSER_PROGRESS=bar|plain|off`
forces a mode. No dependency; nothing is drawn for an empty sequence.
"""
from __future__ import annotations

import os
import shutil
import sys
import time

BAR_WIDTH = 24
_CLEAR = "\r\x1b[K"


def _fmt_time(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _mode(stream) -> str:
    forced = os.environ.get("PYFUSER_PROGRESS", "").strip().lower()
    if forced in ("bar", "plain", "off"):
        return forced
    try:
        return "bar" if stream.isatty() else "plain"
    except (AttributeError, ValueError):
        return "plain"


class _Guarded:
    """A text stream that clears the progress line before writing and redraws it after '\\n'."""

    def __init__(self, real, progress):
        self._real, self._progress = real, progress

    def write(self, s):
        p = self._progress
        p._erase()
        n = self._real.write(s)
        if s.endswith("\n"):
            self._real.flush()
            p._draw()
        return n

    def flush(self):
        self._real.flush()

    def __getattr__(self, name):
        return getattr(self._real, name)


class Progress:
    def __init__(self, total: int, label: str = "", stream=None):
        self.total, self.label = total, label
        self.stream = stream if stream is not None else sys.stderr
        self.mode = _mode(self.stream)
        self.done = 0
        self.what = ""
        self.t0 = time.perf_counter()
        self._shown = False
        self._saved = None

    # ---- the bar ------------------------------------------------------------------------------
    def line(self) -> str:
        frac = self.done / self.total if self.total else 1.0
        fill = int(round(frac * BAR_WIDTH))
        elapsed = time.perf_counter() - self.t0
        left = f" ~{_fmt_time(elapsed / self.done * (self.total - self.done))} left" \
            if 0 < self.done < self.total else ""
        text = (f"{self.label} [{'#' * fill}{'-' * (BAR_WIDTH - fill)}] {self.done}/{self.total} "
                f"{_fmt_time(elapsed)}{left}  {self.what}")
        width = shutil.get_terminal_size((100, 20)).columns - 1
        return text[:max(width, 20)]

    def _draw(self) -> None:
        if self.mode == "bar" and self.total:
            self.stream.write(_CLEAR + self.line())
            self.stream.flush()
            self._shown = True

    def _erase(self) -> None:
        if self._shown:
            self.stream.write(_CLEAR)
            self.stream.flush()
            self._shown = False

    # ---- items ----------------------------------------------------------------------------------
    def start(self, what: str = "") -> None:
        """Item `done + 1` begins."""
        self.what = what
        if self.mode == "bar":
            self._guard()
            self._draw()
        elif self.mode == "plain":
            print(f"[{self.done + 1}/{self.total}] {self.label}: {what}".rstrip(": "),
                  file=self.stream, flush=True)

    def finish(self) -> None:
        """The current item is done."""
        self.done += 1
        self.what = ""
        self._draw()

    def close(self) -> None:
        if self.mode == "bar":
            self._erase()
            self._unguard()
        if self.mode != "off" and self.total:
            print(f"{self.label}: {self.done}/{self.total} in {_fmt_time(time.perf_counter() - self.t0)}",
                  file=self.stream, flush=True)

    def _guard(self) -> None:
        if self._saved is None:
            self._saved = (sys.stdout, sys.stderr)
            sys.stdout = _Guarded(sys.stdout, self)
            sys.stderr = _Guarded(sys.stderr, self)

    def _unguard(self) -> None:
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved
            self._saved = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def track(items, label: str = "", name=str, stream=None):
    """Yield each of `items`, showing progress (module docstring); `name(item)` labels it."""
    items = list(items)
    p = Progress(len(items), label, stream)
    try:
        for item in items:
            p.start(name(item))
            yield item
            p.finish()
    finally:
        p.close()
