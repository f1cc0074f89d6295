"""The CPU interpreter: a large int64 program runs in seconds and matches eager exactly."""
import time

import torch

from codegen_cases import B, DataType, make_fusion, run_plan


def test_large_int64_program_is_fast():
    def build():
        a = B.define_tensor([-1, -1], DataType.Int)
        b = B.define_tensor([-1, -1], DataType.Int)
        c = B.define_tensor([-1, -1], DataType.Int32)
        return B.cast(B.elementwise("mul", B.elementwise("add", B.cast(a, DataType.Int32), b), c),
                      DataType.Int)
    n, m = 2000, 1300
    a, b = torch.randint(-9, 9, (n, m)), torch.randint(-9, 9, (n, m))
    c = torch.randint(-9, 9, (n, m), dtype=torch.int32)
    f = make_fusion(build)
    t0 = time.perf_counter()
    _, outs = run_plan(f, [a, b, c])
    assert time.perf_counter() - t0 < 10
    assert torch.equal(outs[0], ((a.to(torch.int32) + b) * c).to(torch.int64))


def test_grid_stride_loops_cover_everything_with_a_small_grid():
    from pyfuser.codegen import api, interpreter
    from pyfuser.codegen.kernel import LaunchConfig
    from pyfuser.ir.shapes import bind
    f = make_fusion(lambda: B.elementwise("neg", B.define_tensor([-1, -1], DataType.Float)))
    x = torch.randn(50, 70)
    plan = api.plan_kernel(f, [x])
    out = plan.allocate_outputs(bind(f, [x]), [x], "cpu")[0].fill_(float("nan"))
    interpreter.Interpreter(plan, [x, out], bind(f, [x])).run(LaunchConfig((2, 1, 1), (plan.schedule.params.block, 1, 1)))
    assert torch.equal(out, -x)
