"""Plain-text view of an Explanation (`print(explain(...))`, `pyfuser explain FILE.ir`).

One block per group (its segments in run order, for each kernel the scheduler and why those
ranked above it refused, its parameters, launch and bytes, the cuts), then the ops left outside
the groups, ops with the same kind, reason and blocker on one line. `verbose` adds the Fusion
IR exprs of every segment and lists every unfused op on its own line.
"""
from __future__ import annotations

import re
import textwrap
from collections import OrderedDict

WIDTH = 100


def human_bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _wrap(text: str, indent: str) -> list:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False) or [indent]


def _value(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return str(v)


def params_text(params: dict) -> str:
    return " ".join(f"{k}={_value(v)}" for k, v in params.items()
                    if k != "reason" and v not in ("", None, [], 0) or k in ("kind", "vec"))


def _launch(launch: dict) -> str:
    g, b = launch["grid"], launch["block"]
    return (f"grid ({g[0]}, {g[1]}, {g[2]}) block ({b[0]}, {b[1]}, {b[2]}) "
            f"shared memory {launch['shared_mem']} B")


def compact_refusals(text: str) -> str:
    """"a: x; b: x; c: y" (the registry's joined refusals) -> "a, b: x; c: y"."""
    from ..schedule.registry import names
    alt = "|".join(re.escape(n) for n in sorted(names(), key=len, reverse=True))
    parts = re.split(rf"; (?=(?:{alt}): )", text)
    merged: list = []
    for part in parts:
        m = re.match(rf"({alt}): (.*)\Z", part, re.S)
        if not m:
            return text
        if merged and merged[-1][1] == m.group(2):
            merged[-1][0].append(m.group(1))
        else:
            merged.append(([m.group(1)], m.group(2)))
    return "; ".join(f"{', '.join(ns)}: {why}" for ns, why in merged)


def refusals(verdicts) -> list:
    """[(scheduler names, reason)] of the schedulers ranked above the chosen one, neighbours
    refusing for the same reason joined."""
    out = []
    for v in verdicts:
        if v.chosen:
            break
        if out and out[-1][1] == v.refusal:
            out[-1][0].append(v.scheduler)
        else:
            out.append(([v.scheduler], v.refusal))
    return out


def _kernel_lines(seg, ind: str) -> list:
    lines = []
    for names, why in refusals(seg.verdicts):
        lines += _wrap(f"{', '.join(names)} refused: {why}", ind)
    k = seg.kernel
    if k is None:
        if seg.error:
            lines += _wrap(f"no kernel: {seg.error}", ind)
        return lines
    lines += _wrap(f"params: {params_text(k.params)}", ind)
    if k.params.get("reason"):
        lines += _wrap(f"why: {k.params['reason']}", ind)
    lines.append(f"{ind}launch: {_launch(k.launch)}, {k.index_type} indices")
    moved = (f"{ind}moves: {human_bytes(k.bytes_in)} in + {human_bytes(k.bytes_out)} out = "
             f"{human_bytes(k.bytes_moved)}")
    if k.bench:
        b = k.bench
        moved += (f"; {b['us']:.1f} µs, {b['pct_of_copy']:.0f}% of a same-size copy's rate "
                  f"(copy {b['copy_us']:.1f} µs)")
    lines.append(moved)
    return lines


def _segment_lines(seg, verbose: bool) -> list:
    ops = ", ".join(op.split(" = ", 1)[-1].split("(", 1)[0] for op in seg.ops)
    head = f"  segment {seg.index}: {seg.kind}"
    if seg.kind == "kernel":
        head += f" [{seg.scheduler or seg.segmenter_scheduler}]"
        if seg.kernel is not None:
            head += f" {seg.kernel.name}"
    ind = "      "
    lines = textwrap.wrap(f"{head}: {ops}", WIDTH, subsequent_indent=ind,
                          break_on_hyphens=False)
    if seg.kind == "host":
        lines.append(f"{ind}views on the host: no kernel, no copy")
    elif seg.kind == "eager":
        lines += _wrap(f"runs eagerly (reference evaluator): {seg.reason}", ind)
    else:
        lines += _kernel_lines(seg, ind)
    if verbose:
        lines += [f"{ind}  {op}" for op in seg.ops]
    return lines


def op_kinds(ops) -> str:
    """"aten::add x2, aten::layer_norm" from TorchScript node lines (or Fusion IR exprs)."""
    counts: "OrderedDict" = OrderedDict()
    for op in ops:
        rhs = op.split(" = ", 1)[-1]
        kind = rhs.split("(", 1)[0].split("[", 1)[0]
        if kind in ("prim::ListConstruct", "prim::TupleConstruct"):
            continue
        if kind.startswith("prim::") and kind.endswith("_copy"):   # the fuser's form of a view
            kind = "aten::" + kind[len("prim::"):-len("_copy")]
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(k if n == 1 else f"{k} x{n}" for k, n in counts.items())


def group_lines(g, verbose: bool = False) -> list:
    n_k = sum(s.kind == "kernel" for s in g.segments)
    lines = textwrap.wrap(f"{g.name} ({op_kinds(g.ops)}) -> {len(g.segments)} segment(s), "
                          f"{n_k} kernel(s)", WIDTH, subsequent_indent="    ",
                          break_on_hyphens=False)
    if g.status != "fused":
        lines += _wrap(f"runs eagerly: {g.eager_reason}", "  ")
        if g.segments:
            lines.append("  under torch.no_grad() it would run as:")
    split = compact_refusals(g.split_reason) if g.split_reason else ""
    if split:
        lines += _wrap(f"not one kernel: no scheduler takes all its ops: {split}", "  ")
    for s in g.segments:
        lines += _segment_lines(s, verbose)
    for c in g.cuts:
        why = c.reason
        prefix = "no scheduler takes them together: "
        if why.startswith(prefix):
            rest = compact_refusals(why[len(prefix):])
            why = prefix + ("the same refusals as the whole group's" if rest == split else rest)
        lines += _wrap(f"cut {c.tensor} ({human_bytes(c.nbytes)}, segment {c.from_segment} -> "
                       f"{c.to_segment}): {why}", "  ")
    return lines


def fallback_lines(fallbacks, verbose: bool = False) -> list:
    if not fallbacks:
        return ["every op that computes tensors is in a fusion group"]
    lines = [f"outside the groups ({len(fallbacks)} op(s), run by eager PyTorch):"]
    merged: "OrderedDict" = OrderedDict()
    for f in fallbacks:
        blocker = (f.blocker.node, f.blocker.why) if f.blocker else None
        key = (f.kind, f.reason, blocker) if not verbose else (id(f),)
        merged.setdefault(key, []).append(f)
    for fs in merged.values():
        f = fs[0]
        what = f.node if len(fs) == 1 else f"{f.kind} x{len(fs)} (" + \
            ", ".join(x.node.rsplit("-> ", 1)[-1] for x in fs) + ")"
        lines += _wrap(f"{what}: {f.reason}", "  ")
        if f.blocker:
            lines += _wrap(f"blocked by {f.blocker.node}: {f.blocker.why}", "      ")
    return lines


def _mentions(texts, op: str) -> bool:
    op = op.lower()
    return any(op in t.lower() for t in texts)


def render(e, verbose: bool = False, op: str | None = None) -> str:
    """The text view; with `op`, only the groups and outside ops whose ops mention it (a
    TorchScript kind such as `linear`, or a Fusion IR op such as `welford`)."""
    s = e.summary()
    where = "CUDA" if e.executor == "cuda" else "the CPU interpreter"
    lines = [f"pyfuser explain: {e.source} ({e.frontend}, {e.device}; kernels run on {where})",
             f"{s['groups']} group(s), {s['kernels']} kernel(s), {s['host_segments']} host "
             f"segment(s), {s['eager_segments']} eager segment(s), {s['cuts']} cut(s); "
             f"{s['fallbacks']} op(s) outside the groups"]
    lines += [f"note: {n}" for n in e.notes]
    groups, fallbacks = e.groups, e.fallbacks
    if op:
        groups = [g for g in groups if _mentions(g.ops + [o for s in g.segments for o in s.ops], op)]
        fallbacks = [f for f in fallbacks if _mentions([f.kind, f.node], op)]
        lines.append(f"only what mentions {op!r}: {len(groups)} group(s), {len(fallbacks)} op(s) "
                     "outside the groups")
    for g in groups:
        lines.append("")
        lines += group_lines(g, verbose)
    if e.frontend != "fusion_definition" and (fallbacks or not op):
        lines.append("")
        lines += fallback_lines(fallbacks, verbose)
    return "\n".join(lines) + "\n"
