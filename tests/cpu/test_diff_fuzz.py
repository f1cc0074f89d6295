"""Differential fuzzing in CI: a fixed set of random programs (program_fuzz.generate, seeds
0..PROGRAMS-1) through pyfuser.jit with both CPU executors, checked against eager. A failure
prints the shrunk program (IR text and inputs) to turn into a regression test
(test_fuzz_regressions.py). The 10,000-program run, on a CPU or a GPU: bench/fuzz_programs.py."""
from __future__ import annotations

import os

import pytest

import program_fuzz as PF

PROGRAMS = int(os.environ.get("PYFUSER_FUZZ_PROGRAMS", "300"))
CHUNK = 50


@pytest.mark.parametrize("start", range(0, PROGRAMS, CHUNK))
def test_random_programs_match_eager(start):
    failures = PF.run_many(range(start, min(start + CHUNK, PROGRAMS)))
    report = "\n\n".join(f"{f}\n{PF.describe(p)}" for p, f in failures)
    assert not failures, f"{len(failures)} program(s) differ from eager:\n{report}"


def test_generator_covers_the_space():
    """The programs exercise what the fuzzer claims to: dtypes, ranks 0-3, size-0 and size-1
    axes, strided inputs, scalars, views, expands, reductions, in-place ops."""
    progs = [PF.generate(s) for s in range(PROGRAMS)]
    kinds = {op.kind for p in progs for op in p.ops}
    inputs = [i for p in progs for i in p.inputs]
    tensors = [i for i in inputs if i.kind == "tensor"]
    assert {i.dtype for i in tensors} == set(PF.DTYPES)
    assert {len(i.shape) for i in tensors} == {0, 1, 2, 3}
    assert any(0 in i.shape for i in tensors) and any(1 in i.shape for i in tensors)
    assert {i.layout for i in tensors} == set(PF.LAYOUTS)
    assert any(i.kind != "tensor" for i in inputs)
    for k in ("aten::view", "aten::reshape", "aten::permute", "aten::expand", "aten::sum",
              "aten::where", "aten::to", "aten::add_", "aten::mul_", "aten::pow"):
        assert k in kinds, k
    assert sum(len(p.ops) for p in progs) > 3 * len(progs)
