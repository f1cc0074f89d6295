"""pyfuser.progress: a bar in a terminal, plain lines when piped; `pyfuser demo` uses it."""
from __future__ import annotations

import io
import sys

from pyfuser.cli import main
from pyfuser.progress import Progress, track


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_plain_lines_when_piped(monkeypatch):
    monkeypatch.delenv("PYFUSER_PROGRESS", raising=False)
    out = io.StringIO()
    seen = list(track(["a", "b", "c"], "work", stream=out))
    assert seen == ["a", "b", "c"]
    lines = out.getvalue().splitlines()
    assert lines[:3] == ["[1/3] work: a", "[2/3] work: b", "[3/3] work: c"]
    assert lines[3].startswith("work: 3/3 in ") and len(lines) == 4
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_bar_in_a_terminal_keeps_prints_above_it(monkeypatch, capsys):
    monkeypatch.delenv("PYFUSER_PROGRESS", raising=False)
    tty = FakeTTY()
    stdout = sys.stdout
    for item in track(["x", "y"], "bench", stream=tty):
        assert sys.stdout is not stdout           # prints go through the guard
        print(f"result {item}")
    assert sys.stdout is stdout                   # restored
    text = tty.getvalue()
    assert "bench [" in text and "2/2" in text and "\r\x1b[K" in text
    assert "#" * 24 in text                       # the full bar once both are done
    # every print cleared the bar first: the bar's text never precedes a result on a line
    printed = capsys.readouterr().out
    assert printed == "result x\nresult y\n"


def test_forced_off_and_empty(monkeypatch):
    monkeypatch.setenv("PYFUSER_PROGRESS", "off")
    out = io.StringIO()
    assert list(track([1, 2], "quiet", stream=out)) == [1, 2] and out.getvalue() == ""
    monkeypatch.setenv("PYFUSER_PROGRESS", "plain")
    with Progress(0, "none", stream=out) as p:
        assert p.mode == "plain"
    assert out.getvalue() == ""


def test_demo_shows_progress(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PYFUSER_PROGRESS", raising=False)
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", "evaluator")
    monkeypatch.setenv("PYFUSER_DUMP", "")
    (tmp_path / "a.ir").write_text("graph(%x : Float(4, 4)):\n  %y : Tensor = aten::neg(%x)\n"
                                   "  return (%y)\n")
    (tmp_path / "b.ir").write_text("graph(%x : Float(4, 4)):\n  %y : Tensor = aten::relu(%x)\n"
                                   "  return (%y)\n")
    assert main(["demo", str(tmp_path), "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "[1/2] pyfuser demo: a.ir" in err and "[2/2] pyfuser demo: b.ir" in err
    assert "pyfuser demo: 2/2 in " in err
