"""The checking half of the differential fuzzer (program_fuzz.py generates the programs): `check`
runs a program through pyfuser's eager runner (the reference, with the GPU's `pow` rule where
pyfuser follows it) and through `pyfuser.jit` with each executor, and `compare`s outputs,
inputs after the run, strides and requires_grad; `shrink` makes a failing program smaller;
`describe` prints one; `run_many` checks a range of seeds.

`check(program, modes, device) -> Failure | None` runs the graph through pyfuser's eager runner
(the reference) and through `pyfuser.jit` with each CPU executor ("evaluator", "interpret"; on
CUDA, the kernels), and compares: every output's dtype, shape and values (exact for integers
and bools, to a tolerance per float dtype, NaNs equal), strides where eager returns a view of
an input, the inputs after the run (in-place ops), requires_grad; when eager raises, pyfuser
must raise too. `shrink(program, failure)` makes a failing program smaller (fewer outputs,
dead ops removed) while it keeps failing.

GPU semantics: pyfuser's kernels follow eager's CUDA `pow` of float16/bfloat16 tensors, also
through the CPU interpreter: constant exponents 2, 3 and -2 as products in the tensor's dtype
(each rounded), 0.5 / -0.5 / -1 as sqrt / rsqrt / reciprocal, other exponents in float32 rounded
once (measured on an H100, tools/gpu_pow_rule.py). The lowering writes pow that way, so both CPU
executors (the interpreter and the evaluator, which runs the lowered Fusion's ops eagerly) are
compared with a reference that runs that rule (`_GPU_SEMANTICS`): eager's CPU `pow` of float16
rounds once (seed 3079 of the 10,000-program run: `pow(x, 3.0)` then `frac`). The reference's
`gelu` (approximate="none") is the op table's formula (ir/ops.py `_gelu`), CUDA eager's: CPU
eager's gives NaN for +inf on its vectorized path and inf otherwise (seed 731072: a bfloat16
gelu of three infinities was NaN; the FX fuzzer's checker judges gelu so too).
"""
from __future__ import annotations

import re
from typing import Callable, Optional

import torch

from pyfuser.frontend.torchscript import parse_ir, run_graph
from pyfuser.frontend.torchscript.jit import CompiledGraph, eager_handler

from program_fuzz import BF16, F16, TOLERANCE, Failure, OpRecord, Program, generate


def _gpu_pow(node, args, ctx):
    """Eager CUDA's pow of half / bfloat16 tensors (see the module docstring)."""
    if node.kind != "aten::pow" or not args or not isinstance(args[0], torch.Tensor):
        return eager_handler(node, args, ctx)
    dt = torch.result_type(args[0], args[1])
    if dt not in (F16, BF16):
        return eager_handler(node, args, ctx)
    x, e = args[0].to(dt), args[1]
    if not isinstance(e, torch.Tensor) and not isinstance(e, bool):
        special = {2: lambda: x * x, 3: lambda: (x * x) * x, -2: lambda: torch.reciprocal(x * x),
                   0.5: lambda: torch.sqrt(x), -0.5: lambda: torch.rsqrt(x),
                   -1: lambda: torch.reciprocal(x)}.get(e)
        if special is not None:
            return [special()]
    e = e.float() if isinstance(e, torch.Tensor) else e
    return [torch.pow(x.float(), e).to(dt)]


_GPU_SEMANTICS = _gpu_pow


def _formula_gelu(handler):
    """`handler` with aten::gelu (approximate="none") computed by the op table's formula."""
    def run(node, args, ctx):
        if node.kind == "aten::gelu" and args and isinstance(args[0], torch.Tensor) and \
                args[0].is_floating_point() and (len(args) < 2 or args[1] == "none"):
            from pyfuser.ir.ops import _gelu
            return [_gelu(args[0])]
        return handler(node, args, ctx)
    return run


def _shares_input(out, inputs) -> bool:
    if not isinstance(out, torch.Tensor) or out.numel() == 0:
        return False
    ptrs = {x.untyped_storage().data_ptr() for x in inputs
            if isinstance(x, torch.Tensor) and x.numel()}
    return out.untyped_storage().data_ptr() in ptrs


def loosest_input_dtype(program: "Program") -> Optional[torch.dtype]:
    """The least precise floating dtype among the program's tensor inputs (None: none): a
    float64 value computed from float32 inputs carries float32's rounding, whatever its dtype."""
    dts = [i.dtype for i in program.inputs if i.kind == "tensor" and i.dtype in TOLERANCE]
    return max(dts, key=lambda d: TOLERANCE[d]) if dts else None


def compare(ref, got, ref_inputs=None, loosest=None, judge=None) -> Optional[str]:
    """None when `got` matches eager's `ref`, else what differs; floats within the tolerance of
    their dtype, or of `loosest` where that is less precise, or accepted by `judge(i, ref_i,
    got_i)` (check's float64 judge of an ill-conditioned output)."""
    if len(ref) != len(got):
        return f"{len(got)} outputs, eager has {len(ref)}"
    for i, (a, b) in enumerate(zip(ref, got)):
        if not isinstance(a, torch.Tensor):
            if a != b:
                return f"output {i}: {b!r}, eager {a!r}"
            continue
        if not isinstance(b, torch.Tensor):
            return f"output {i}: {type(b).__name__}, eager a tensor"
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"output {i}: {b.dtype} {tuple(b.shape)}, eager {a.dtype} {tuple(a.shape)}"
        if a.requires_grad != b.requires_grad:
            return f"output {i}: requires_grad {b.requires_grad}, eager {a.requires_grad}"
        if ref_inputs is not None and _shares_input(a, ref_inputs) and any(
                n > 1 and sa != sb for n, sa, sb in zip(a.shape, a.stride(), b.stride())):
            # (a size-1 axis' stride is arbitrary)
            return f"output {i}: strides {b.stride()}, eager's view has {a.stride()}"
        if a.numel() == 0:
            continue
        a, b = a.detach(), b.detach()
        if a.dtype.is_floating_point:
            rtol, atol = max(TOLERANCE[a.dtype], TOLERANCE.get(loosest, (0, 0)))
            if not torch.allclose(a.double(), b.double().to(a.device), rtol=rtol, atol=atol,
                                  equal_nan=True) and not (judge is not None and judge(i, a, b)):
                d = (a.double() - b.double().to(a.device)).abs().nan_to_num(0)
                return f"output {i} ({a.dtype}): max abs err {float(d.max()):.4g}"
        elif not torch.equal(a, b.to(a.device)):
            return f"output {i} ({a.dtype}): values differ"
    return None


def _run_ref(program, device, gpu_rule: bool = False):
    inputs = program.make_inputs(device)
    handler = _formula_gelu(_GPU_SEMANTICS if gpu_rule else eager_handler)
    g = None
    try:                      # in the caller's grad mode, as pyfuser.jit runs
        g = parse_ir(program.text)
        out = run_graph(g, inputs, device=device, node_handler=handler, no_grad=False)
        return g, inputs, out, None
    except Exception as e:         # noqa: BLE001 - eager rejects the program at run time
        return g, inputs, None, e


def _float64_outputs(program, device):
    """Eager's outputs with every floating input in float64 and float64 the default dtype (so an
    integer promoted to a float computes in float64 too); None when that run raises."""
    inputs = [x.detach().double() if isinstance(x, torch.Tensor) and x.is_floating_point()
              else x for x in program.make_inputs(device)]
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return run_graph(parse_ir(program.text), inputs, device=device,
                         node_handler=eager_handler, no_grad=True)
    except Exception:              # noqa: BLE001 - no judgement then: the mismatch stands
        return None
    finally:
        torch.set_default_dtype(old)


def float64_judge(program, device) -> Callable:
    """judge(i, ref_i, got_i): output i of pyfuser (`got_i`) is at most twice as far from the
    float64 run's as eager's (`ref_i`) is, NaNs where eager's are. For ill-conditioned outputs
    (a sum of terms of size 1 cancelling to 1e-3, then its reciprocal: seed 600791), where the
    order of a float32 sum moves the result past the dtype's tolerance and neither order is
    wrong; a wrong result is farther from float64 than eager's rounding."""
    cache: list = []

    def judge(i, a, b) -> bool:
        if not cache:
            cache.append(_float64_outputs(program, device))
        r64 = cache[0]
        if r64 is None or i >= len(r64) or not isinstance(r64[i], torch.Tensor) or \
                r64[i].shape != a.shape:
            return False
        exact = r64[i].detach().double().to(a.device)
        a, b = a.double(), b.double().to(a.device)
        if not torch.equal(a.isnan(), b.isnan()):
            return False
        ours = (b - exact).abs().nan_to_num(0).max()
        eagers = (a - exact).abs().nan_to_num(0).max()
        return bool(ours <= 2 * eagers)
    return judge


def check(program: Program, modes=("evaluator", "interpret"), device="cpu") -> Optional[Failure]:
    refs: dict = {}
    for mode in (modes if device == "cpu" else ("cuda",)):
        # pyfuser lowers pow as the GPU rounds it: both executors run that lowering
        gpu_rule = "aten::pow" in program.text
        if gpu_rule not in refs:
            refs[gpu_rule] = _run_ref(program, device, gpu_rule)
        g, ref_inputs, ref, err = refs[gpu_rule]
        if g is None:
            return Failure("parse", f"the program does not parse: {err}")
        inputs = program.make_inputs(device)
        try:
            f = CompiledGraph(g, cpu_executor=mode if device == "cpu" else None)
            got = f.run(inputs, device=device)
        except Exception as e:     # noqa: BLE001
            if err is not None:
                continue                               # both raise: as eager
            return Failure(mode, f"raised {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        if err is not None:
            return Failure(mode, f"returned a result where eager raises "
                                 f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
        bad = compare(ref, got, ref_inputs, loosest_input_dtype(program),
                      float64_judge(program, device))
        if bad is None:
            bad = compare(ref_inputs, inputs)
            bad = None if bad is None else f"inputs after the run: {bad}"
        if bad is not None:
            return Failure(mode, bad)
    return None


def shrink(program: Program, failure: Failure, modes=("evaluator", "interpret"),
           device="cpu") -> Program:
    """A smaller program that still fails: one output, dead ops dropped, then ops bypassed
    (their result replaced by an operand) while eager still runs it and pyfuser still fails."""
    def still_fails(p):
        _, _, _, err = _run_ref(p, device)
        return err is None and check(p, modes, device) is not None

    best = program
    for out in program.outputs:
        cand = _prune(Program(program.seed, program.inputs, program.ops, [out]))
        if len(cand.ops) <= len(best.ops) and still_fails(cand):
            best = cand
    changed = True
    while changed:
        changed = False
        for i in reversed(range(len(best.ops))):
            op = best.ops[i]
            for repl in op.uses:
                cand = _prune(_bypass(best, i, repl))
                if len(cand.ops) < len(best.ops) and still_fails(cand):
                    best, changed = cand, True
                    break
            if changed:
                break
    return best


def _bypass(p: Program, i: int, repl: str) -> Program:
    """`p` with op i removed and its result read as `repl` instead."""
    old = p.ops[i].out
    pat = re.compile(rf"%{re.escape(old)}\b")
    ops = []
    for k, op in enumerate(p.ops):
        if k == i:
            continue
        if k > i:
            op = OpRecord(op.out, op.kind, [repl if a == old else a for a in op.args],
                          pat.sub("%" + repl, op.line),
                          [repl if a == old else a for a in op.uses])
        ops.append(op)
    return Program(p.seed, p.inputs, ops, [repl if o == old else o for o in p.outputs])


def _prune(p: Program) -> Program:
    needed = set(p.outputs)
    keep = []
    for op in reversed(p.ops):
        writes_needed = op.kind.endswith("_") and any(a in needed for a in op.args[:1])
        if op.out in needed or writes_needed:
            keep.append(op)
            needed.update(op.args)
    keep.reverse()
    return Program(p.seed, p.inputs, keep, p.outputs)


def describe(program: Program) -> str:
    ins = ", ".join(f"%{i.name}: {i.dtype} {tuple(i.shape)} {i.layout}"
                    f"{' requires_grad' if i.requires_grad else ''}" if i.kind == "tensor"
                    else f"%{i.name}: {i.kind} = {i.value}" for i in program.inputs)
    return f"seed {program.seed}; inputs {ins}\n{program.text}"


def run_many(seeds, modes=("evaluator", "interpret"), device="cpu",
             on_failure: Optional[Callable] = None) -> list:
    """[(program, failure)] for the seeds whose program fails."""
    failures = []
    for s in seeds:
        p = generate(s)
        f = check(p, modes, device)
        if f is not None:
            small = shrink(p, f, modes, device)
            failures.append((small, check(small, modes, device) or f))
            if on_failure is not None:
                on_failure(*failures[-1])
    return failures
