"""Plots of the benchmarks: % of the copy rate per workload for eager, torch.compile and pyfuser.

    python bench/plot.py docs/benchmarks.md --list                  # the tables it can plot
    python bench/plot.py docs/benchmarks.md -o docs/img/x.svg [--table 0,2] [--match TEXT]
    python bench/plot.py OUT/bench_normalization.json -o plot.png

A source is a Markdown file (tables whose cells read `12.3 (45%)`: the benchmarks' time and %
of the copy rate, as bench/*.py print them and docs/benchmarks.md keeps them) or a JSON file
written by `bench/common.save_plot` ({"title", "series", "rows": [{"workload", series: %}]}).
From Markdown, a table's series are its columns whose header starts with a wanted name
(`--series`, default eager, torch.compile, pyfuser: "eager runner µs (%)" is eager) and whose
cells carry a %; a workload is the first column, plus the dtype column where there is one.
Without --table / --match the first table (docs/benchmarks.md lists the newest run first) with
at least two of the series is plotted; several tables given are drawn as one plot.

The figure: one row per workload, a bar per series, the % at each bar's end, a line at 100% (as
fast as a copy of the same bytes). PNG or SVG by the output's extension (SVG keeps its text as
text and no date, so a regenerated plot of the same data is the same file). Needs matplotlib
(the dev extra); importing this module does not.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field

SERIES = ("eager", "torch.compile", "pyfuser")
COLOURS = {"eager": "#9ca3af", "torch.compile": "#f59e0b", "pyfuser": "#2563eb",
           "torch.compile (CUDA graphs)": "#b45309", "pyfuser (CUDA graphs)": "#1e3a8a"}
_PCT = re.compile(r"^\s*(?:[-+]?[\d.]+\s*)?\(\s*([\d.]+)\s*%\s*\)\s*$")
_HEADING = re.compile(r"^(#+)\s+(.*\S)\s*$")


def parse_pct(cell) -> float | None:
    """The % of a cell `12.3 (45%)` (or `(45%)`), else None."""
    if isinstance(cell, (int, float)):
        return float(cell)
    m = _PCT.match(str(cell))
    return float(m.group(1)) if m else None


@dataclass
class Table:
    title: str
    headers: list
    rows: list = field(default_factory=list)


def parse_markdown(text: str) -> list:
    """Every pipe table of a Markdown text, titled by the headings above it."""
    tables, headings, lines = [], {}, text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        h = _HEADING.match(line)
        if h:
            level = len(h.group(1))
            headings = {k: v for k, v in headings.items() if k < level}
            headings[level] = h.group(2)
        is_table = line.strip().startswith("|") and i + 1 < len(lines) and \
            re.match(r"^\s*\|[\s:|-]+\|\s*$", lines[i + 1])
        if not is_table:
            i += 1
            continue
        headers = _cells(line)
        rows = []
        i += 2
        while i < len(lines) and lines[i].strip().startswith("|"):
            rows.append(_cells(lines[i]))
            i += 1
        title = " / ".join(headings[k] for k in sorted(headings) if k > 1 or len(headings) == 1)
        tables.append(Table(title, headers, rows))
    return tables


def _cells(line: str) -> list:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _column_name(header: str) -> str:
    return re.sub(r"\s*(µs|us|ms)?\s*\(%\)\s*$", "", header).strip()


def series_of(table: Table, wanted=SERIES) -> tuple:
    """(workload labels, {series: [% or None per row]}) of a table; series without a single %
    are left out."""
    cols = {}
    for j, h in enumerate(table.headers):
        name = _column_name(h).lower()
        for w in wanted:
            if w not in cols and (name == w or name.startswith(w + " ")):
                if any(parse_pct(r[j]) is not None for r in table.rows if j < len(r)):
                    cols[w] = j
    dtype = next((j for j, h in enumerate(table.headers) if h.lower() == "dtype"), None)
    labels = [r[0] + (f" {r[dtype]}" if dtype is not None and dtype < len(r) else "")
              for r in table.rows]
    data = {w: [parse_pct(r[j]) if j < len(r) else None for r in table.rows]
            for w, j in cols.items()}
    return labels, {w: data[w] for w in wanted if w in data}


def _tag(table: Table) -> str:
    """The benchmark script a table came from (`bench/graphs.py` in its title: "graphs")."""
    m = re.search(r"bench/(\w+)\.py", table.title)
    return m.group(1) if m else ""


def rows_from_tables(tables, wanted=SERIES) -> list:
    """[{"workload", series: %}] of the tables, in order; with several tables, each workload is
    prefixed with its script's name where the title gives it."""
    out = []
    for t in tables:
        labels, data = series_of(t, wanted)
        tag = _tag(t) if len(tables) > 1 else ""
        for k, label in enumerate(labels):
            row = {"workload": f"{tag}: {label}" if tag else label}
            row.update({w: v[k] for w, v in data.items()})
            out.append(row)
    return out


def load(path: str, tables=None, match=None, wanted=SERIES) -> tuple:
    """(title, rows, series) from a Markdown or JSON source (module docstring)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        d = json.loads(text)
        series = [s for s in d.get("series", wanted) if s in wanted] or list(wanted)
        return d.get("title", path), d["rows"], series
    found = parse_markdown(text)
    usable = [(k, t) for k, t in enumerate(found) if len(series_of(t, wanted)[1]) >= 2]
    if tables:
        chosen = [found[k] for k in tables]
    elif match:
        chosen = [t for _, t in usable if match.lower() in (t.title + " ".join(t.headers)).lower()]
        chosen = chosen[:1]
    else:
        chosen = [usable[0][1]] if usable else []
    if not chosen:
        raise SystemExit(f"bench/plot.py: no table with at least two of {', '.join(wanted)} "
                         f"in {path}")
    series = [w for w in wanted if any(w in series_of(t, wanted)[1] for t in chosen)]
    return chosen[0].title, rows_from_tables(chosen, wanted), series


COPY_RATE = "% of the copy rate (bytes that must move / time, over a copy's)"


def plot(rows, out_path: str, title: str = "", series=SERIES, xlabel: str = COPY_RATE) -> str:
    """Draw `rows` ([{"workload", series: % or None}]) into out_path (.png or .svg); `xlabel`
    says what the % is of (the dashed line is at 100%)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    matplotlib.rcParams["svg.fonttype"] = "none"
    matplotlib.rcParams["svg.hashsalt"] = "pyfuser"
    series = [s for s in series if any(r.get(s) is not None for r in rows)]
    n, k = len(rows), max(len(series), 1)
    bar = 0.8 / k
    fig, ax = plt.subplots(figsize=(8.5, 1.3 + n * (0.17 * k + 0.12)))
    top = max([100.0] + [r[s] for r in rows for s in series if r.get(s) is not None])
    for i, s in enumerate(series):
        ys = [row - 0.4 + bar * (i + 0.5) for row in range(n)]
        vals = [r.get(s) for r in rows]
        ax.barh([y for y, v in zip(ys, vals) if v is not None], [v for v in vals if v is not None],
                height=bar * 0.92, color=COLOURS.get(s), label=s)
        for y, v in zip(ys, vals):
            if v is not None:
                ax.text(v + top * 0.01, y, f"{v:.0f}%", va="center", fontsize=7)
    ax.axvline(100, color="#111827", linewidth=0.8, linestyle="--")
    ax.set_yticks(range(n))
    ax.set_yticklabels([r["workload"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.12)
    ax.set_xlabel(xlabel)
    if title:
        ax.set_title(title, fontsize=9, pad=22)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=k, fontsize=8, frameon=False)
    fig.tight_layout()
    meta = {"Date": None} if out_path.endswith(".svg") else {"Software": None}
    fig.savefig(out_path, metadata=meta, dpi=130)
    plt.close(fig)
    return out_path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="a Markdown file of benchmark tables or a JSON from save_plot")
    ap.add_argument("-o", "--out", default=None, help="output .png or .svg")
    ap.add_argument("--table", default="", help="indices of the tables to plot (see --list)")
    ap.add_argument("--match", default="", help="the first usable table whose title has this")
    ap.add_argument("--series", default=",".join(SERIES))
    ap.add_argument("--title", default=None)
    ap.add_argument("--list", action="store_true", help="list the tables and their series")
    a = ap.parse_args(argv)
    wanted = tuple(s.strip() for s in a.series.split(",") if s.strip())
    if a.list:
        with open(a.source, encoding="utf-8") as f:
            for k, t in enumerate(parse_markdown(f.read())):
                found = list(series_of(t, wanted)[1])
                if found:
                    print(f"{k}: {t.title} [{', '.join(found)}] ({len(t.rows)} rows)")
        return 0
    if not a.out:
        ap.error("-o/--out is required (or --list)")
    tables = [int(x) for x in a.table.split(",") if x.strip()]
    title, rows, series = load(a.source, tables, a.match, wanted)
    plot(rows, a.out, a.title if a.title is not None else title, series)
    print(f"wrote {a.out} ({len(rows)} workloads: {', '.join(series)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
