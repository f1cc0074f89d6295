"""The output of bench/models.py: its markdown table, the pyfuser / Inductor ratios (`-cg` modes
against `-cg` modes), the compile-time summary against issue 16's targets, the speed rows of the
plot, and the files written under --out (bench_models.md, bench_models.json,
bench_models_speed.svg). Reads the rows run_case made; times nothing."""
from __future__ import annotations

import json
import os
import time

COLUMNS = ["model", "dtype", "mode", "fwd_ms", "train_ms", "fwd_kernels", "train_kernels",
           "cold_s", "warm_s", "trace_s", "trace_warm_s", "regions", "check", "error"]
TARGETS = {"cold_s": 1 / 3, "warm_s": 1 / 10}       # issue 16: pyfuser / Inductor at most


def _fmt(v) -> str:
    if v is None:
        return ""
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def table(rows) -> str:
    used = [c for c in COLUMNS if any(c in r for r in rows)]
    lines = ["| " + " | ".join(used) + " |", "|" + "|".join("---" for _ in used) + "|"]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in used) + " |" for r in rows]
    return "\n".join(lines)


def ratios(rows) -> str:
    """pyfuser / Inductor per model and dtype (fwd, train, cold, warm): below 1 is faster."""
    by = {(r["model"], r["dtype"], r["mode"]): r for r in rows}
    lines = []
    for (m, d, mode), r in by.items():
        if not mode.startswith("pyfuser"):
            continue
        other = mode.replace("pyfuser", "inductor")
        ind = by.get((m, d, other))
        if ind is None:
            continue
        parts = [f"{k} {r[k] / ind[k]:.2f}" for k in ("fwd_ms", "train_ms", "cold_s", "warm_s")
                 if r.get(k) and ind.get(k)]
        if parts:
            lines.append(f"- {m} {d}: {mode} / {other} " + ", ".join(parts))
    return "\n".join(lines)


def compile_summary(rows) -> str:
    """Per model and dtype, pyfuser's compile time against Inductor's (the issue's targets), whole
    and without what both pay for Dynamo and AOTAutograd (`trace_s`, the aot_eager baseline)."""
    by = {(r["model"], r["dtype"], r["mode"]): r for r in rows}
    lines = []
    for (m, d, mode), r in by.items():
        if mode != "pyfuser" or not r.get("cold_s"):
            continue
        ind = by.get((m, d, "inductor"), {})
        parts = []
        for col, trace, label in (("cold_s", "trace_s", "cold"),
                                  ("warm_s", "trace_warm_s", "warm")):
            mine, theirs, t = r.get(col), ind.get(col), r.get(trace)
            if mine is None:
                continue
            text = f"{label} {mine:.2f} s"
            if theirs:
                ok = "meets" if mine / theirs <= TARGETS[col] + 1e-9 else "misses"
                text += (f" vs Inductor {theirs:.2f} s = {mine / theirs:.2f} ({ok} the target "
                         f"{TARGETS[col]:.2f})")
            if t is not None:
                text += f"; backend's own (minus aot_eager's {t:.2f} s) {mine - t:.2f} s"
                if theirs:
                    own = (mine - t) / (theirs - t) if theirs - t > 0 else float("inf")
                    text += f" vs Inductor {theirs - t:.2f} s = {own:.2f}"
            parts.append(text)
        lines.append(f"- {m} {d}: " + "; ".join(parts))
    return "\n".join(lines)


SPEED_SERIES = {"eager": "eager", "inductor": "torch.compile", "pyfuser": "pyfuser",
                "inductor-cg": "torch.compile (CUDA graphs)",
                "pyfuser-cg": "pyfuser (CUDA graphs)"}     # mode -> the plot's series


def speed_rows(rows) -> list:
    """Plot rows: per model, dtype and step, each mode's speed as % of eager's (eager = 100)."""
    by = {(r["model"], r["dtype"], r["mode"]): r for r in rows}
    series = SPEED_SERIES
    out = []
    for (m, d, mode), r in by.items():
        if mode != "eager":
            continue
        for step in ("fwd_ms", "train_ms"):
            if not r.get(step):
                continue
            row = {"workload": f"{m} {d} {step[:-3]}"}
            for mo, label in series.items():
                if not any(k[2] == mo for k in by):      # a mode this run did not time
                    continue
                t = by.get((m, d, mo), {}).get(step)
                row[label] = 100.0 * r[step] / t if t else None
            out.append(row)
    return out


def write_outputs(out_dir: str, text: str, rows, facts: dict, with_plot: bool = True) -> list:
    os.makedirs(out_dir, exist_ok=True)
    written = []
    path = os.path.join(out_dir, "bench_models.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    written.append(path)
    path = os.path.join(out_dir, "bench_models.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"facts": facts, "rows": rows}, f, indent=1)
    written.append(path)
    plot_rows = speed_rows(rows) if with_plot else []
    if plot_rows:
        try:
            from bench.common import _plot_module
            plot = _plot_module()
            written.append(plot.plot(
                plot_rows, os.path.join(out_dir, "bench_models_speed.svg"),
                f"bench/models.py on {facts['device']}", series=list(SPEED_SERIES.values()),
                xlabel="speed as % of eager's (eager's time / the mode's time)"))
        except Exception as e:  # noqa: BLE001 - the table and JSON are the record
            print(f"bench/models.py: no plot: {type(e).__name__}: {e}")
    return written


def report(rows, args, size, device, start) -> tuple:
    """(markdown text, run facts) of the rows so far."""
    import torch
    gpu = torch.cuda.get_device_name() if device == "cuda" else "CPU (kernel interpreter)"
    facts = {"device": gpu, "torch": torch.__version__, "batch": size.batch, "seq": size.seq,
             "hidden": size.hidden, "layers": size.layers, "reps": args.reps, "rounds": args.rounds,
             "seconds": round(time.perf_counter() - start, 1), "date": time.strftime("%Y-%m-%d")}
    from pyfuser.runtime import native
    facts["native_runner"] = native.runner_module() is not None
    text = (f"bench/models.py on {gpu}, torch {torch.__version__}, {facts['date']}: batch "
            f"{size.batch} x {size.seq}, hidden {size.hidden}, {size.layers} layers (ResNet-18: "
            f"batch {size.batch}, {'224' if device == 'cuda' else '32'} px); median of "
            f"{args.reps}{f' (interleaved in {args.rounds} rounds)' if args.rounds else ''}; "
            f"{facts['seconds']:.0f} s; native cached-call runner "
            f"{'on' if facts['native_runner'] else 'OFF'}\n\n{table(rows)}\n\n{ratios(rows)}\n")
    summary = compile_summary(rows)
    if summary:
        text += ("\nCompile time (first forward + first training step; targets: cold <= 1/3 of "
                 "Inductor's, warm <= 1/10; 'own' leaves out Dynamo and AOTAutograd, measured "
                 "through aot_eager):\n" + summary + "\n")
    return text, facts
