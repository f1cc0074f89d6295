"""Every op of the op table, for every dtype it accepts, and every cast: the interpreter of the
generated kernel equals eager, and every generated kernel compiles with NVRTC for sm_90."""
import pytest
import torch

from pyfuser.errors import FusionDefinitionError
from pyfuser.ir.ops import OPS

from codegen_cases import B, DataType, assert_close, compile_many, make_fusion, run_plan

DTYPES = [DataType.Bool, DataType.Byte, DataType.Char, DataType.Short, DataType.Int32, DataType.Int,
          DataType.Half, DataType.BFloat16, DataType.Float, DataType.Double]
SHAPE = (6, 40)
SCALARS = {"leaky_relu": {1: 0.1}, "softplus": {1: 2.0, 2: 5.0}, "hardtanh": {1: -1.0, 2: 1.0},
           "threshold": {1: 0.5, 2: 2.0}, "addcmul": {3: 0.5}}
ROUNDED_QUOTIENT = {"div_trunc", "div_floor"}
NONZERO = {"div_trunc", "div_floor", "remainder", "fmod", "div"}


def make_input(dtype: DataType, seed: int, op: str, pos: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype is DataType.Bool:
        return torch.randint(0, 2, SHAPE, generator=g).bool()
    if dtype.is_floating:
        x = torch.randn(SHAPE, generator=g, dtype=torch.float64) * 3
        if op in ("acosh",):
            x = x.abs() + 1
        return x.to(dtype.torch)
    lo, hi = (0, 60) if dtype is DataType.Byte else (-60, 60)
    if op == "pow":
        lo, hi = (0, 6) if pos == 1 else (-4, 5)
        lo = max(lo, 0) if dtype is DataType.Byte else lo
    if op.startswith("bitwise_") and "shift" in op and pos == 1:
        lo, hi = 0, dtype.itemsize * 8 + 2
    x = torch.randint(lo, hi, SHAPE, generator=g).to(dtype.torch)
    if op in NONZERO and pos == 1:
        x = torch.where(x == 0, torch.ones_like(x), x)
    return x


def op_cases():
    for name, info in OPS.items():
        for dt in DTYPES:
            yield name, dt


def _build_case(name, dt):
    info = OPS[name]
    scal = SCALARS.get(name, {})
    inputs, args = [], []
    for pos in range(info.arity):
        if pos in scal:
            v = scal[pos]
            args.append(int(v * 4) if not dt.is_floating and name == "addcmul" else v)
        elif name == "where" and pos == 0:
            inputs.append(make_input(DataType.Bool, pos, name, pos))
            args.append(None)
        else:
            inputs.append(make_input(dt, 17 * pos + 3, name, pos))
            args.append(None)

    def build():
        it = iter([B.define_tensor([-1, -1], DataType.from_torch(x.dtype)) for x in inputs])
        return B.elementwise(name, *[next(it) if a is None else a for a in args])

    def ref():
        it = iter(inputs)
        return info.ref(*[next(it) if a is None else a for a in args])
    return build, inputs, ref


def test_every_op_every_dtype():
    plans, ran = [], 0
    for name, dt in op_cases():
        build, inputs, ref = _build_case(name, dt)
        try:
            want = ref()
        except (RuntimeError, TypeError, NotImplementedError):
            continue  # eager does not take this dtype
        try:
            f = make_fusion(build)
        except FusionDefinitionError:
            continue
        plan, outs = run_plan(f, inputs)
        if name in ROUNDED_QUOTIENT and dt.is_reduced_float:
            # eager rounds a/b to half/bf16 before truncating; the kernel keeps it in float
            assert (outs[0].double() - want.double()).abs().max() <= 1, name
        else:
            assert_close(outs[0], want, f"{name}[{dt.name}]")
        plans.append(plan)
        ran += 1
    assert ran > 250, ran
    for i in range(0, len(plans), 200):
        compile_many(plans[i:i + 200])


@pytest.mark.parametrize("src", DTYPES, ids=lambda d: d.name)
def test_casts_from(src):
    plans = []
    x = make_input(src, 5, "cast", 0)
    if src.is_floating:
        x = (x * 10).to(src.torch)     # values beyond the small integer range, in range of int8
        x = x.clamp(-100, 100)
    for dst in DTYPES:
        if dst is src:
            continue
        if src.is_floating and dst is DataType.Byte:
            xx = x.abs()               # negative float -> uint8 is unspecified in C and eager
        else:
            xx = x
        f = make_fusion(lambda: B.cast(B.define_tensor([-1, -1], src), dst))
        plan, outs = run_plan(f, [xx])
        assert_close(outs[0], xx.to(dst.torch), f"cast {src.name}->{dst.name}")
        plans.append(plan)
    compile_many(plans)


def test_div_trunc_reduced_rounds_the_quotient_first():
    """Eager CUDA computes trunc(a / b) in half/bf16 arithmetic: the quotient is rounded first."""
    from pyfuser.codegen import api
    from codegen_cases import B, make_fusion, run_plan

    def build():
        a = B.define_tensor([-1], DataType.BFloat16)
        b = B.define_tensor([-1], DataType.BFloat16)
        return B.elementwise("div_trunc", a, b)
    a = torch.tensor([2.99] * 8, dtype=torch.bfloat16) * torch.tensor(3.0, dtype=torch.bfloat16)
    b = torch.full((8,), 3.0, dtype=torch.bfloat16)
    plan, outs = run_plan(make_fusion(build), [a, b])
    assert "trunc(pf_round_bf16(" in plan.body
    want = torch.trunc((a.float() / b.float()).to(torch.bfloat16).float()).to(torch.bfloat16)
    assert torch.equal(outs[0], want)


@pytest.mark.parametrize("policy", ["cs", "ef", "el"])
def test_cache_policy_loads_and_stores_print_and_compile(monkeypatch, policy):
    """Every cache policy, on loads and stores of 1..16 bytes (fp64 x1, fp32 x4/x1, fp16 x8/x1):
    the source names it, NVRTC assembles it for sm_90 and the interpreter's result is eager's."""
    from pyfuser.runtime.nvrtc import compile_cuda
    from codegen_cases import B, make_fusion, run_plan
    monkeypatch.setenv("PYFUSER_LOAD_CACHE", policy)
    monkeypatch.setenv("PYFUSER_STORE_CACHE", policy)
    macro = {"cs": "PF_CS", "ef": "PF_EF", "el": "PF_EL"}[policy]
    for dt, tdt in ((DataType.Float, torch.float32), (DataType.Half, torch.float16),
                    (DataType.Double, torch.float64), (DataType.Bool, torch.bool)):
        def build():
            a = B.define_tensor([-1], dt)
            return B.elementwise("bitwise_xor" if dt == DataType.Bool else "mul", a, a)
        for n in (64, 63):
            x = torch.randn(n).to(tdt) if dt != DataType.Bool else torch.rand(n) > 0.5
            plan, outs = run_plan(make_fusion(build), [x])
            assert f"pf_ldc<{macro}, " in plan.body and f"pf_stc<{macro}, " in plan.body
            assert torch.equal(outs[0], x ^ x if dt == DataType.Bool else x * x)
            compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90", use_disk_cache=False)


def test_cache_policy_env_rejects_unknown(monkeypatch):
    from codegen_cases import B, make_fusion, run_plan
    monkeypatch.setenv("PYFUSER_LOAD_CACHE", "evict_sometimes")
    with pytest.raises(ValueError, match="PYFUSER_LOAD_CACHE"):
        run_plan(make_fusion(lambda: B.elementwise("neg", B.define_tensor([-1], DataType.Float))),
                 [torch.randn(8)])


@pytest.mark.parametrize("dt,tdt", [(DataType.BFloat16, torch.bfloat16), (DataType.Half, torch.float16)])
def test_stored_only_results_round_once(dt, tdt):
    """A half/bf16 op result that is only stored is rounded by the store's conversion alone; one
    that also feeds another op keeps its own rounding. Both outputs equal eager bit for bit."""
    from codegen_cases import B, make_fusion, run_plan

    def build():
        a, b = B.define_tensor([-1], dt), B.define_tensor([-1], dt)
        m = B.elementwise("mul", a, b)            # stored and used by the add
        return [m, B.elementwise("add", m, a)]    # stored only
    a = torch.randn(4099).to(tdt)
    b = torch.randn(4099).to(tdt)
    plan, outs = run_plan(make_fusion(build), [a, b])
    lets = {ln.split("=")[0].split()[-1]: ln for ln in plan.body.splitlines() if "const float t" in ln}
    mul_let = next(v for v in lets.values() if "pf_mul(" in v)
    add_let = next(v for v in lets.values() if "pf_add(" in v)
    assert "pf_round_" in mul_let and "pf_round_" not in add_let
    assert torch.equal(outs[0], a * b) and torch.equal(outs[1], a * b + a)


@pytest.mark.parametrize("dt,tdt,kind", [(DataType.BFloat16, torch.bfloat16, "bf16"),
                                         (DataType.Half, torch.float16, "half")])
def test_store_of_a_rounded_value_converts_once(dt, tdt, kind):
    """A value rounded to half/bf16 (it feeds another op) and also stored: the store converts the
    value before the rounding (one conversion, the same bits), never the rounded one again; the
    kernel compiles for sm_90 and both outputs equal eager bit for bit."""
    import re
    from codegen_cases import B, make_fusion, run_plan
    from pyfuser.runtime.nvrtc import compile_cuda

    def build():
        a, b = B.define_tensor([-1], dt), B.define_tensor([-1], dt)
        m = B.elementwise("mul", a, b)
        return [m, B.elementwise("add", m, a)]
    a, b = torch.randn(4099).to(tdt), torch.randn(4099).to(tdt)
    plan, outs = run_plan(make_fusion(build), [a, b])
    rounded = dict(re.findall(rf"const float (t\d+) = pf_round_{kind}\((.*)\);", plan.body))
    assert rounded, plan.body
    for name, inner in rounded.items():
        assert f"pf_to_storage<pf_{kind}>({name})" not in plan.body
        assert f"pf_to_storage<pf_{kind}>({inner})" in plan.body
    assert torch.equal(outs[0], a * b) and torch.equal(outs[1], a * b + a)
    compile_cuda(plan.kernel.source, plan.kernel.name, "sm_90", use_disk_cache=False)
