"""The random-op programs of the torch.compile backend's fuzzer (tests/cpu/fx_fuzz_random.py):
dropout, rand_like, bernoulli, uniform_ and rand among fx_fuzz's lines, judged by the draws'
laws, a replay of each compiled call's draws, reproducibility and independence.
PYFUSER_FX_FUZZ_RANDOM_PROGRAMS=N runs another count; `bench/fuzz_fx.py --random-ops` is the
long run."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import fx_fuzz_random as FR
from pyfuser.frontend.lowering import registry as REG
from pyfuser.ir import builder as B

N_PROGRAMS = int(os.environ.get("PYFUSER_FX_FUZZ_RANDOM_PROGRAMS", "12"))


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_random_programs_pass():
    failures = [str(f) for _, f in FR.run_many(range(N_PROGRAMS)) if f is not None]
    assert not failures, "\n\n".join(failures)


def test_programs_draw_every_random_op():
    programs = [FR.generate(s) for s in range(80)]
    kinds = {line.kind for p in programs for line in p.randoms}
    assert kinds == {"dropout", "rand_like", "bernoulli_p", "bernoulli_t", "uniform", "rand"}
    assert any(p.grad and any(x.kind == "dropout" for x in p.randoms) for p in programs)
    p = FR.generate(2)
    assert FR.generate(2).source == p.source and "_R(" in FR.replay_source(p)


def _patched(monkeypatch, kind, handler):
    low = REG.LOWERINGS[kind]
    monkeypatch.setitem(REG.LOWERINGS, kind, dataclasses.replace(low, handler=handler))


# seed 57 is a grad-mode program whose x0 (480 elements) reaches an output through a dropout
def test_the_checker_catches_a_backward_without_the_mask(monkeypatch):
    p = FR.generate(57)
    assert p.grad and "F.dropout(" in p.source
    assert FR.check(p) is None
    _patched(monkeypatch, "aten::native_dropout_backward",
             lambda g, m, s: B.elementwise("mul", g, float(s)))
    f = FR.check(FR.generate(57))
    assert f is not None and "grad" in f.what


def test_the_checker_catches_a_wrong_scale_and_a_repeated_draw(monkeypatch):
    p = FR.generate(55)
    low = REG.LOWERINGS["aten::native_dropout"]

    def scaled(x, prob, train):
        out, mask = low.handler(x, prob, train)
        return B.elementwise("mul", out, 1.01), mask
    _patched(monkeypatch, "aten::native_dropout", scaled)
    f = FR.check(p)
    assert f is not None and "replay" in f.what
    monkeypatch.setitem(REG.LOWERINGS, "aten::native_dropout", low)
    from pyfuser.runtime import rng
    monkeypatch.setattr(rng, "launch_state", lambda device, increment: (123, 0))
    f = FR.check(FR.generate(57))
    assert f is not None and ("same numbers" in f.what or "joint" in f.what)
