"""The `pyfuser` command: `show`, `run` and `demo` on TorchScript IR files.

    pyfuser show FILE.ir                    print the parsed graph
    pyfuser run FILE.ir [--device D] [--seed N] [--json] [--bench] [--shrink N] [--full-size]
                                            random inputs from the declared types; fuse, run,
                                            check against eager, report (fuse_run.py)
    pyfuser demo DIR [--verbose] [--show-cuda] [--cuda-dir D]
                                            fuse + run + check every DIR/*.ir, one line each;
                                            non-zero exit if any fails or differs from eager
    pyfuser explain FILE.ir [--device D] [--seed N] [--shrink N] [--full-size] [--json]
                            [--html OUT.html] [--bench] [--verbose] [--op NAME]
                                            why each op fused or not: groups, segments,
                                            schedulers' verdicts, cuts, kernels (pyfuser.explain)

`run_file(path, device, seed) -> dict` builds the report (`file`, `device`, `seed`,
`outputs`: [{shape, dtype}]); later stages add keys (groups, kernels, host_segments,
fallbacks, matches_eager, ...) by extending it, and `--json` prints the dict as one JSON object.
Any PyfuserError is printed as `pyfuser: error: FILE:LINE:COL: message` on stderr, exit 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Optional

from pyfuser.errors import PyfuserError


def default_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_graph(path: str):
    from pyfuser.frontend.torchscript import parse_ir
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise PyfuserError(f"cannot read {path}: {e}") from None
    return parse_ir(text, filename=path)


def describe_output(v: Any) -> dict:
    """{shape, dtype} of a tensor; {items: [...]} of a tuple/list holding tensors; else the
    value's type and repr."""
    import torch
    if isinstance(v, torch.Tensor):
        return {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
    if isinstance(v, (list, tuple)) and any(isinstance(e, (torch.Tensor, list, tuple)) for e in v):
        return {"shape": None, "dtype": type(v).__name__,
                "items": [describe_output(e) for e in v]}
    return {"shape": None, "dtype": type(v).__name__, "value": repr(v)}


def run_file(path: str, device: Optional[str] = None, seed: int = 0, graph=None,
             shrink: Optional[int] = None, fuse: bool = False, bench: bool = False) -> dict:
    """Parse, make inputs, run eagerly; the report dict (see module docstring). With `fuse`,
    also fuse and compare (fuse_run.fuse_report's keys); `shrink` caps every size."""
    from pyfuser.frontend.torchscript import make_inputs, run_graph
    from pyfuser.frontend.torchscript.jit import eager_handler
    device = device or default_device()
    g = graph if graph is not None else load_graph(path)
    inputs = make_inputs(g, device=device, seed=seed, size_override=shrink)
    if fuse:       # eager runs on copies (the graph may write its inputs), the fused graph after
        from pyfuser.frontend.torchscript.fuse_run import clone_inputs
        outputs = run_graph(g, clone_inputs(inputs), device=device, node_handler=eager_handler)
    else:
        outputs = run_graph(g, inputs, device=device, node_handler=eager_handler)
    report = {"file": path, "device": device, "seed": seed,
              "outputs": [describe_output(o) for o in outputs]}
    if fuse:
        from pyfuser.frontend.torchscript.fuse_run import fuse_report
        report.update(fuse_report(g, device, seed, shrink, bench, inputs=inputs, ref=outputs))
    return report


def _format_outputs(report: dict) -> str:
    lines = []
    for i, o in enumerate(report["outputs"]):
        lines.append(f"  output {i}: {_format_output(o)}")
    return "\n".join(lines)


def _format_output(o: dict) -> str:
    if o["shape"] is not None:
        return f"shape {o['shape']} dtype {o['dtype']}"
    if "items" in o:
        return f"{o['dtype']}(" + ", ".join(_format_output(e) for e in o["items"]) + ")"
    return f"{o['dtype']} = {o.get('value')}"


def cmd_show(args) -> int:
    sys.stdout.write(str(load_graph(args.file)))
    return 0


def cmd_run(args) -> int:
    from pyfuser.frontend.torchscript.fuse_run import text_summary
    from pyfuser.frontend.torchscript.run_limits import check_run
    device = args.device or default_device()
    g = load_graph(args.file)
    check_run(g, device, args.shrink, args.full_size)
    report = run_file(args.file, device, args.seed, graph=g, shrink=args.shrink, fuse=True,
                      bench=args.bench)
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{args.file} on {report['device']}:")
        print(_format_outputs(report))
        print(text_summary(report))
    return 0 if report["matches_eager"] else 1


def cmd_explain(args) -> int:
    from pyfuser.explainer import explain
    from pyfuser.frontend.torchscript import make_inputs
    from pyfuser.frontend.torchscript.run_limits import check_run
    device = args.device or default_device()
    g = load_graph(args.file)
    check_run(g, device, args.shrink, args.full_size)
    inputs = make_inputs(g, device=device, seed=args.seed, size_override=args.shrink)
    e = explain(g, *inputs, bench=args.bench, device=device)
    e.source = args.file
    if args.html:
        e.to_html(args.html)
    if args.json:
        print(json.dumps(e.as_dict()))
    else:
        sys.stdout.write(e.text(verbose=args.verbose, op=args.op))
        if args.html:
            print(f"HTML report: {args.html}")
    return 0


def cmd_demo(args) -> int:
    from pyfuser.frontend.torchscript.fuse_run import demo_env
    from pyfuser.frontend.torchscript.run_limits import check_device
    device = args.device or default_device()
    check_device(device)
    env = demo_env(device, show_cuda=args.show_cuda, cuda_dir=args.cuda_dir)
    print(f"pyfuser demo: every {args.dir}/*.ir parsed, fused, run on random inputs on {device} "
          "and checked against eager PyTorch")
    if device == "cpu":
        print("no GPU: the generated kernels are compiled by NVRTC and run through pyfuser's CPU "
              "interpreter; inputs over 2^24 elements are capped at 128 per axis")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return _demo_files(args, device)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _demo_files(args, device: str) -> int:
    from pyfuser.frontend.torchscript.fuse_run import (CPU_AUTO_SHRINK_TO, demo_line,
                                                       needs_shrink, text_summary)
    files = sorted(f for f in os.listdir(args.dir) if f.endswith(".ir"))
    if not files:
        print(f"pyfuser: error: no *.ir files in {args.dir}", file=sys.stderr)
        return 2
    from pyfuser.progress import track
    failed = 0
    for name in track(files, "pyfuser demo"):
        path = os.path.join(args.dir, name)
        if args.verbose:
            print(f"===== {path} =====")
        try:
            g = load_graph(path)
            if args.verbose:
                sys.stdout.write(str(g))
            shrink = CPU_AUTO_SHRINK_TO if device == "cpu" and needs_shrink(g) else None
            report = run_file(path, device, args.seed, graph=g, fuse=True, shrink=shrink)
            sys.stderr.flush()
            if args.verbose:
                print(f"ran on {report['device']}:")
                print(_format_outputs(report))
                print(text_summary(report))
            else:
                print(demo_line(path, report))
            if not report["matches_eager"]:
                failed += 1
        except PyfuserError as e:
            failed += 1
            print(f"{path}: error (below)")
            _report_error(path, e)
        sys.stdout.flush()
    print(f"{len(files) - failed}/{len(files)} examples ran and matched eager")
    if not args.verbose and not args.show_cuda and not args.cuda_dir:
        print("more: --verbose (graphs, fused graphs, fallbacks), --show-cuda (the generated "
              "CUDA source), --cuda-dir DIR (write it to DIR/*.cu)")
    if args.cuda_dir:
        print(f"CUDA sources written to {args.cuda_dir}/")
    return 1 if failed else 0


def _report_error(path: str, e: PyfuserError) -> None:
    line, col = getattr(e, "line", None), getattr(e, "column", None)
    where = path if line is None else f"{path}:{line}:{col or 1}"
    message = getattr(e, "message", None) or str(e)
    print(f"pyfuser: error: {where}: {message}", file=sys.stderr)
    src = getattr(e, "source_line", "")
    if src and col:
        print(f"  {src}\n  {' ' * (col - 1)}^", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pyfuser", description="pyfuser: a fusion compiler for "
                                "PyTorch. Reads TorchScript IR text.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("show", help="print the parsed graph")
    s.add_argument("file")
    s.set_defaults(fn=cmd_show)
    r = sub.add_parser("run", help="run a graph on random inputs made from its types")
    r.add_argument("file")
    r.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="where to run (default: cuda when available)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument("--bench", action="store_true",
                   help="time pyfuser against eager and torch.compile (GPU only)")
    r.add_argument("--shrink", type=int, default=None, metavar="N",
                   help="cap every input size at N (`demo` caps large graphs on the CPU)")
    r.add_argument("--full-size", action="store_true",
                   help="run inputs over 2^24 elements on the CPU as declared (slow; refused "
                        "without this or --shrink)")
    r.set_defaults(fn=cmd_run)
    x = sub.add_parser("explain", help="why each op fused or not: groups, segments, schedulers, "
                       "cuts, kernels")
    x.add_argument("file")
    x.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="where to run (default: cuda when available)")
    x.add_argument("--seed", type=int, default=0)
    x.add_argument("--json", action="store_true", help="print one JSON object")
    x.add_argument("--html", default=None, metavar="OUT.html",
                   help="write a self-contained HTML report (the graph, groups, segments, CUDA)")
    x.add_argument("--bench", action="store_true",
                   help="time each kernel against a copy of the same bytes (GPU only)")
    x.add_argument("--verbose", action="store_true",
                   help="the Fusion IR exprs of every segment, every unfused op on its own line")
    x.add_argument("--op", default=None, metavar="NAME",
                   help="only the groups and unfused ops that mention NAME (e.g. gelu, linear)")
    x.add_argument("--shrink", type=int, default=None, metavar="N",
                   help="cap every input size at N")
    x.add_argument("--full-size", action="store_true",
                   help="run inputs over 2^24 elements on the CPU as declared")
    x.set_defaults(fn=cmd_explain)
    d = sub.add_parser("demo", help="fuse, run and check every *.ir file of a directory")
    d.add_argument("dir")
    d.add_argument("--device", choices=["cpu", "cuda"], default=None)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--verbose", action="store_true",
                   help="print each graph, its fused graph, outputs and fallbacks")
    d.add_argument("--show-cuda", action="store_true", help="print the generated CUDA source")
    d.add_argument("--cuda-dir", default=None, metavar="DIR",
                   help="write the generated CUDA source of each kernel to DIR/<kernel>.cu")
    d.set_defaults(fn=cmd_demo)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except PyfuserError as e:
        _report_error(getattr(args, "file", None) or getattr(args, "dir", ""), e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
