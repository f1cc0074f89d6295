"""The dynamic-shape fuzzer of the torch.compile backend (tests/cpu/fx_fuzz_dynamic.py, checked
by fx_check_dynamic.py): a few seeds in CI (`PYFUSER_FX_FUZZ_DYNAMIC_PROGRAMS=N` for another
count; bench/fuzz_fx.py --dynamic is the long run), and the checker's own checks: it catches a
backend that is wrong or that makes Dynamo recompile for new sizes, and the generator covers
the op families it is for."""
from __future__ import annotations

import os

import pytest
import torch

import fx_check_dynamic as DC
import fx_fuzz_dynamic as DZ
import pyfuser

N_PROGRAMS = int(os.environ.get("PYFUSER_FX_FUZZ_DYNAMIC_PROGRAMS", "10"))

pytestmark = pytest.mark.usefixtures("fresh_compile")


@pytest.mark.parametrize("chunk", range(2))
def test_random_dynamic_programs_match_eager_without_recompiling(chunk):
    seeds = [s for s in range(N_PROGRAMS) if s % 2 == chunk]
    failures = [str(f) for _, f in DC.run_many(seeds)]
    assert not failures, "\n\n".join(failures)


def test_programs_are_reproducible_from_their_seed():
    a, b = DZ.generate(5), DZ.generate(5)
    assert a.source == b.source and a.inputs == b.inputs and a.sizes == b.sizes
    for k in range(DZ.CALLS):
        for x, y in zip(a.concrete(k).make_inputs(), b.concrete(k).make_inputs()):
            assert (x == y) if isinstance(x, float) else torch.equal(x, y)


def test_programs_cover_the_dynamic_op_families():
    programs = [DZ.generate(s) for s in range(80)]
    text = "\n".join(p.source for p in programs)
    for needle in (".shape[", "torch.arange(", "math.sqrt(", "F.layer_norm(", "softmax(",
                   ".expand(", "torch.bfloat16", "torch.float16", " - 1]", "// 2", ":]"):
        assert needle in text, needle
    assert any(p.floats for p in programs) and any(p.mark for p in programs)
    assert any(p.grad for p in programs) and not all(p.grad for p in programs)
    for p in programs:                          # the varying sizes: 2 or more, first ones apart
        firsts = [v[0] for v in p.sizes.values()]
        assert len(set(firsts)) == len(firsts) and min(firsts, default=2) >= 2
        assert all(min(v) >= 2 for v in p.sizes.values())
    assert sum(any(p.varying(d) for dims, _, _ in p.inputs for d in dims)
               for p in programs) > 60


def _program(source, dims, sizes):
    return DZ.DynProgram(0, source, [(dims, torch.float32, "contiguous")], sizes, [])


def _off_by_a_bit_after_the_first_call(gm, example_inputs):
    """Right on the first call, 0.25 off on the others: only checking every size catches it."""
    compiled = pyfuser.backend(gm, example_inputs)
    calls = [0]

    def run(*args):
        calls[0] += 1
        outs = list(compiled(*args))
        return [o + 0.25 if calls[0] > 1 and o.is_floating_point() else o for o in outs]
    return run


def _specialising(gm, example_inputs):
    """pyfuser behind a backend that reads its symbolic sizes as ints: a guard on each value,
    so Dynamo recompiles for every new size."""
    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            int(x)
    return pyfuser.backend(gm, example_inputs)


def test_the_checker_catches_wrong_results_at_later_sizes_and_recompiles():
    p = _program("def f(x0):\n    v1 = torch.softmax(x0[:, 1:] * 2, -1)\n    return (v1,)\n",
                 ("n0", "n1"), {"n0": [3, 5, 4], "n1": [6, 9, 7]})
    assert DC.check(p) is None
    f = DC.check(p, backend=_off_by_a_bit_after_the_first_call)
    assert f is not None and f.what.startswith("call 1") and "not close" in f.what, f
    f = DC.check(p, backend=_specialising)
    assert f is not None and "recompiled" in f.what, f


def test_dynamos_own_recompiles_are_skipped_not_failed():
    """A program whose own ops make Dynamo guard on a size (a slice one element long at one
    size) recompiles with aot_eager too: not pyfuser's, counted in stats."""
    p = _program("def f(x0):\n    v1 = x0[:, 1:] + x0[:, :1]\n    return (v1,)\n",
                 ("n0", "n1"), {"n0": [3, 5, 4], "n1": [6, 2, 7]})
    assert DC.check(p) is None and p.stats.get("dynamo_recompiled")
