"""Golden checks on generated CUDA text: seed 000's program keeps its arithmetic as written."""
import re

import torch

from codegen_cases import B, DataType, check, make_fusion


def seed000():
    a = B.define_tensor([-1, -1], DataType.Int)
    b = B.define_tensor([-1, -1], DataType.Int)
    c = B.define_tensor([-1, -1], DataType.Int32)
    s = B.elementwise("add", B.cast(a, DataType.Int32), b)
    return B.cast(B.elementwise("mul", s, c), DataType.Int)


def test_seed000_one_add_then_one_mul_of_the_sum():
    a = torch.randint(-2 ** 40, 2 ** 40, (40, 130))
    b = torch.randint(-2 ** 40, 2 ** 40, (40, 130))
    c = torch.randint(-1000, 1000, (40, 130), dtype=torch.int32)
    plan = check(seed000, [a, b, c], lambda a, b, c: ((a.to(torch.int32) + b) * c).to(torch.int64))
    body = plan.body
    assert body.count("__global__") == 1
    adds = re.findall(r"const int64_t (t\d+) = pf_add\((t\d+), (t\d+)\);", body)
    muls = re.findall(r"const int64_t (t\d+) = pf_mul\((t\d+), (t\d+)\);", body)
    assert len(adds) == 1 and len(muls) == 1, body
    assert muls[0][1] == adds[0][0]          # the product takes the sum itself
    assert body.index("pf_add(") < body.index("pf_mul(")
    # no distributed form a*c + b*c
    assert body.count("pf_mul(") == 1 and body.count("pf_add(") == 1
    assert "pf_ld<2>" in body and re.search(r"pf_st(_cs)?<2>", body)   # 16-byte int64 accesses
    assert plan.kernel.name == "pf_cast_add_mul_kernel"


def test_scheduler_transforms_are_printed():
    from pyfuser.codegen import api
    from pyfuser.ir.printer import print_fusion
    f = make_fusion(seed000)
    before = print_fusion(f)
    x = torch.zeros(64, 128, dtype=torch.int64)
    plan = api.plan_kernel(f, [x, x, x.int()])
    assert print_fusion(f) == before                      # the user's fusion is untouched
    text = print_fusion(plan.schedule.fusion)
    assert "Split" in text and "Merge" in text, text
