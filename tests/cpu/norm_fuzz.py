"""Random normalization cases for differential fuzzing: softmax-like and normalization programs
(softmax, log_softmax, exp(x - amax) / sum written out, exp(x - amax) alone and its mirror
exp(amax - x), logsumexp, layer norm with and without weight and bias, RMS norm, cross-entropy,
var_mean, training batch norm over the rows) over random row counts and lengths, reduced
dims, dtypes, value scales and offsets, special rows (infinities, NaN), transposed layouts and
reduction knobs (clusters, the two-pass form, streamed rows, exponentials through expf, rows
staged in shared memory or held in registers),
through `pyfuser.jit` against eager.

Case i is `case(i)`, reproducible from its seed alone. `check(i, device)` runs it and returns
None or the failure's description. An output passes when it is within the reduction tests'
tolerance of eager's (tests/cpu/reduction_cases.py: per dtype for normalized values, a sum's
tolerance for reductions), or, for ill-conditioned inputs (large offsets), when it is no
farther from the float64 result than twice eager's distance plus what the offset costs float
arithmetic (`_conditioning_floor`); NaN positions must be eager's.
The long run is bench/fuzz_norms.py; tests/cpu/test_norm_fuzz.py runs a few cases in CI.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import torch

import reduction_cases as RC


def softmax(x, d: int):
    return torch.softmax(x, d)


def log_softmax(x, d: int):
    return torch.log_softmax(x, d)


def softmax_written_out(x, d: int):
    e = torch.exp(x - x.amax(d, keepdim=True))
    return e / e.sum(d, keepdim=True)


def shifted_exp(x, d: int):
    return torch.exp(x - x.amax(d, keepdim=True)), x.sum(d)


def mirrored_exp(x, d: int):
    return torch.exp(x.amax(d, keepdim=True) - x) * 1e-3, x.sum(d)


def float_softmax(x, d: int):
    return torch.softmax(x.float(), d).to(x.dtype)


def logsumexp(x, d: int):
    return torch.logsumexp(x, d)


def layer_norm(x, d: int):
    return torch.nn.functional.layer_norm(x, [x.shape[-1]])


def rms_norm(x, d: int):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def layer_norm_affine(x, d: int):
    n = x.shape[-1]
    w = torch.arange(n, dtype=x.dtype, device=x.device) * 0.01 + 0.5
    return torch.nn.functional.layer_norm(x, [n], w, w - 1.0, 1e-5)


def cross_entropy(x, d: int):
    t = (torch.arange(x.shape[0], device=x.device) * 7) % x.shape[1]
    return torch.nn.functional.cross_entropy(x, t)


def var_mean(x, d: int):
    v, m = torch.var_mean(x, d)
    return v, m


def batch_norm(x, d: int):
    return torch.nn.functional.batch_norm(x, None, None, None, None, True, 0.1, 1e-5)


PROGRAMS = [softmax, log_softmax, softmax_written_out, shifted_exp, mirrored_exp, float_softmax,
            logsumexp, layer_norm, rms_norm, layer_norm_affine, cross_entropy, var_mean,
            batch_norm]
LAST_AXIS_ONLY = (layer_norm, rms_norm, layer_norm_affine, cross_entropy, batch_norm)
KNOBS = [{}, {"PYFUSER_RED_ONLINE": "0"}, {"PYFUSER_RED_CLUSTER": "2", "PYFUSER_RED_STEPS": "1"},
         {"PYFUSER_RED_CLUSTER": "4", "PYFUSER_RED_STEPS": "1"}, {"PYFUSER_RED_STEPS": "0"},
         {"PYFUSER_RED_SHIFTED_EXP": "0"}, {"PYFUSER_RED_STAGE": "1"},
         {"PYFUSER_RED_CLUSTER": "2", "PYFUSER_RED_STEPS": "1", "PYFUSER_RED_STAGE": "0"}]
DTYPES = [torch.float32, torch.float32, torch.bfloat16, torch.float16, torch.float64]


@dataclass
class Case:
    seed: int
    program: object
    dtype: torch.dtype
    shape: tuple
    dim: int
    knobs: dict = field(default_factory=dict)
    scale: float = 1.0
    offset: float = 0.0
    special: bool = False
    transposed: bool = False

    def describe(self) -> str:
        return (f"seed {self.seed}: {self.program.__name__} {self.dtype} {self.shape} "
                f"dim={self.dim} scale={self.scale} offset={self.offset} special={self.special} "
                f"transposed={self.transposed} knobs={self.knobs}")

    def input(self, device="cpu") -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed)
        rows, cols = self.shape
        x = torch.randn(rows, cols, generator=g, dtype=torch.float64) * self.scale + self.offset
        if self.special:
            x = RC.special_rows(rows, cols, torch.float64, gen=g)
        x = x.to(self.dtype)
        if self.transposed:
            x = x.t().contiguous().t()
        return x.to(device)


def case(seed: int) -> Case:
    rnd = random.Random(seed)
    program = rnd.choice(PROGRAMS)
    dim = -1 if program in LAST_AXIS_ONLY else rnd.choice([-1, -1, 0])
    return Case(seed, program, rnd.choice(DTYPES),
                (rnd.choice([1, 2, 3, 7]), rnd.choice([1, 3, 17, 128, 300, 1031, 2100, 4099, 8236])),
                dim, rnd.choice(KNOBS), rnd.choice([1.0, 10.0, 100.0]),
                rnd.choice([0.0, 50.0, -1000.0]), dim == -1 and rnd.random() < 0.3,
                rnd.random() < 0.3)


# whole_case: rows every thread of a team holds alike (the plan's `whole`: Welford merges of
# equal counts, rows without bounds checks), the Welford programs most, and the knobs of the
# warps' Welford tree (staged rows merge as a tree; =1 everywhere, =0 nowhere)
WELFORD = (var_mean, layer_norm, layer_norm_affine, batch_norm)
WHOLE_KNOBS = [{}, {"PYFUSER_RED_STAGE": "1"}, {"PYFUSER_RED_WARP_TREE": "1"},
               {"PYFUSER_RED_STAGE": "1", "PYFUSER_RED_WARP_TREE": "0"},
               {"PYFUSER_RED_EQUAL_MERGE": "0"}, {"PYFUSER_RED_FULL": "1"},
               {"PYFUSER_RED_FULL": "1", "PYFUSER_RED_STAGE": "1"},
               {"PYFUSER_RED_CLUSTER": "2", "PYFUSER_RED_STEPS": "1"},
               {"PYFUSER_RED_CLUSTER": "4", "PYFUSER_RED_STEPS": "1", "PYFUSER_RED_STAGE": "1"},
               {"PYFUSER_RED_STEPS": "0"}, {"PYFUSER_RED_STEPS": "0", "PYFUSER_RED_FULL": "1"}]


def whole_case(seed: int) -> Case:
    """A case of whole rows: 1-64 rows of a power of two (32-16384), 768 or 3072 elements."""
    rnd = random.Random(seed)
    program = rnd.choice(WELFORD) if rnd.random() < 0.7 else rnd.choice(PROGRAMS)
    dim = -1 if program in LAST_AXIS_ONLY else rnd.choice([-1, -1, 0])
    cols = rnd.choice([32, 128, 512, 768, 1024, 2048, 3072, 4096, 4096, 8192, 8192, 16384, 16384])
    rows = rnd.choice([r for r in (1, 2, 3, 4, 8, 16, 32, 64) if r * cols <= 1 << 17])
    return Case(seed, program, rnd.choice(DTYPES), (rows, cols), dim, rnd.choice(WHOLE_KNOBS),
                rnd.choice([1.0, 10.0, 100.0]), rnd.choice([0.0, 0.0, 50.0, -1000.0]),
                dim == -1 and rnd.random() < 0.2, rnd.random() < 0.2)


def _tolerance(c: Case, want: torch.Tensor, reduced: int) -> tuple:
    # float_softmax computes in float32 and rounds to the input's dtype: both tolerances
    computed = torch.float32 if c.program is float_softmax else c.dtype
    r = max(RC.NORM_TOL[computed], RC.NORM_TOL[want.dtype])
    if want.ndim == 2:
        return r, r
    scale = max(1.0, float(want.double().nan_to_num(0, 0, 0).abs().max())) if want.numel() else 1.0
    return r, max(r, 2.0 ** -20 * (1 + reduced ** 0.5) * scale * (1 if r <= 1e-5 else 64))


# outputs computed from `x - mean`: the floor applies whatever their size (a layer norm's
# weights reach 164 on rows of 16384, a variance 1e4 at scale 100)
CENTERED = {layer_norm: 0, layer_norm_affine: 0, batch_norm: 0, var_mean: 0}


def _conditioning_floor(c, x, ref, k: int = 0) -> float:
    """The error float arithmetic allows on output k, `ref` (float64), of rows offset by
    `c.offset`: `x - mean` keeps |offset| / std fewer significant bits of a row whose spread is
    std, so an output of magnitude M may be 2 eps |offset| / std M off (eps of the computing
    dtype: float32 for half and bfloat16); eager may land closer by its order of operations
    (CPU eager accumulates float32 statistics in double). Other outputs of the offset's own
    size (a mean, a logsumexp) get no floor: their tolerance is relative already."""
    if not c.offset or x.numel() == 0 or ref.numel() == 0:
        return 0.0
    mag = float(ref.abs().nan_to_num(0, 0, 0).max())
    if mag >= abs(c.offset) / 2 and CENTERED.get(c.program) != k:
        return 0.0
    xd = x.double()
    dim = 0 if c.program is batch_norm else c.dim          # batch norm: over the rows, per column
    std = float(xd.std(dim=dim, unbiased=False).nan_to_num(0, 0, 0).clamp_min(1e-30).min())
    eps = torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps / 2
    return 2 * eps * abs(c.offset) / std * mag


def check(seed: int, device: str = "cpu", whole: bool = False) -> str | None:
    """None if case `seed` (`whole_case(seed)` where `whole`) matches eager, else what
    differs."""
    import pyfuser
    c = whole_case(seed) if whole else case(seed)
    x = c.input(device)
    old = {k: os.environ.get(k) for k in c.knobs}
    os.environ.update(c.knobs)
    try:
        f = pyfuser.jit(torch.jit.script(c.program))
        try:
            want = c.program(x, c.dim)
        except Exception as e:  # noqa: BLE001 - eager refuses: pyfuser must refuse too
            try:
                with torch.no_grad():
                    f(x, c.dim)
            except Exception:  # noqa: BLE001
                return None
            return f"{c.describe()}: eager raises ({str(e).splitlines()[0]}), pyfuser does not"
        with torch.no_grad():
            got = f(x, c.dim)
        exact = None
        got, want = (g if isinstance(g, tuple) else (g,) for g in (got, want))
        for k, (a, b) in enumerate(zip(got, want)):
            if a.dtype != b.dtype or a.shape != b.shape:
                return f"{c.describe()}: output {k} {a.dtype} {tuple(a.shape)}, eager {b.dtype} {tuple(b.shape)}"
            if not torch.equal(a.isnan(), b.isnan()):
                return f"{c.describe()}: output {k}: NaN positions differ from eager's"
            rtol, atol = _tolerance(c, b, x.shape[c.dim])
            try:
                torch.testing.assert_close(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True)
            except AssertionError as e:
                if exact is None:
                    exact = c.program(x.double(), c.dim)
                    exact = exact if isinstance(exact, tuple) else (exact,)
                ref = exact[k].to(b.dtype).double()
                ours = float((a.double() - ref).abs().nan_to_num(0, 0, 0).max())
                theirs = float((b.double() - ref).abs().nan_to_num(0, 0, 0).max())
                if ours > 2 * theirs + atol + _conditioning_floor(c, x, ref, k):
                    return (f"{c.describe()}: output {k}: {str(e).splitlines()[0]}; from float64 "
                            f"{ours:.3g}, eager {theirs:.3g}")
        return None
    except Exception as e:  # noqa: BLE001 - any error is a finding, reported with its case
        return f"{c.describe()}: {type(e).__name__}: {e}"
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
