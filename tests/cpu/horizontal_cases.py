"""Fusions of independent pointwise computations (the horizontal scheduler), shared by the CPU and
GPU tests: each builder returns (FusionDefinition's Fusion, inputs, eager function).

`casts(k, seed, device)`: k independent casts of float32 inputs of assorted ranks and shapes (odd
sizes, size-1 and size-0 axes, non-contiguous inputs: transposed, sliced, expanded) to bfloat16,
float16, int32, int64 or bool, as a bf16 autocast casts a model's weights and biases."""
from __future__ import annotations

import random

import torch

from pyfuser.frontend.definition import Fusion, FusionDefinition
from pyfuser.ir import DataType

TARGETS = [(DataType.BFloat16, torch.bfloat16), (DataType.Half, torch.float16),
           (DataType.Int32, torch.int32), (DataType.Int, torch.int64), (DataType.Bool, torch.bool)]
SHAPES = [(7,), (1,), (768,), (33, 5), (1, 9), (17, 1, 3), (3, 4, 5, 2), (2304, 3), (0,), (4, 0)]


def _input(rng: random.Random, shape, device, layout: str) -> torch.Tensor:
    """A float32 tensor of `shape` (values up to about +-100), laid out as `layout` says."""
    def base(*sizes):
        return torch.randn(*sizes, device=device) * 40
    if layout == "transposed" and len(shape) >= 2:
        return base(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
    if layout == "sliced" and len(shape) >= 1:
        return base(*shape[:-1], 2 * shape[-1] + 1)[..., 1::2]
    return base(*shape)


def casts(k: int, seed: int = 0, device="cpu", layouts=("dense", "transposed", "sliced"),
          shapes=SHAPES, targets=TARGETS):
    rng = random.Random(seed)
    inputs, dts = [], []
    for i in range(k):
        shape = shapes[(i + seed) % len(shapes)]
        inputs.append(_input(rng, shape, device, layouts[rng.randrange(len(layouts))]))
        dts.append(targets[rng.randrange(len(targets))])
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        ts = [fd.from_pytorch(x) for x in inputs]
        for t, (dt, _) in zip(ts, dts):
            fd.add_output(fd.ops.cast(t, dt))

    def eager(*xs):
        return [x.to(tdt) for x, (_, tdt) in zip(xs, dts)]
    return fs, inputs, eager


def mixed_ops(device="cpu", n=37, m=29):
    """A bias add with a broadcast, scaled by a scalar input and cast to bf16 ([n, m]); a relu of
    a 3-D tensor ([5, 1, 9] float32); the scalar times a 1-D tensor, cast to half ([m + 2]);
    a cast to int32 of a transposed [m, n] tensor. Four components, one scalar shared."""
    x = torch.randn(n, m, device=device)
    b = torch.randn(m, device=device)
    y = torch.randn(5, 1, 9, device=device)
    z = torch.randn(m + 2, device=device)
    w = torch.randn(n, m, device=device).t() * 30
    alpha = 0.75
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        tx, tb, ty, tz, tw = (fd.from_pytorch(t) for t in (x, b, y, z, w))
        a = fd.define_scalar(DataType.Double)
        bb = fd.ops.broadcast_in_dim(tb, shape=[n, m], broadcast_dims=[1])
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.add(tx, bb), a), DataType.BFloat16))
        fd.add_output(fd.ops.relu(ty))
        fd.add_output(fd.ops.cast(fd.ops.mul(tz, a), DataType.Half))
        fd.add_output(fd.ops.cast(tw, DataType.Int32))

    def eager(x, b, y, z, w, alpha):
        return [((x + b) * alpha).to(torch.bfloat16), torch.relu(y), (z * alpha).half(),
                w.to(torch.int32)]
    return fs, [x, b, y, z, w, alpha], eager


def reduction_and_casts(k: int, device="cpu"):
    """A row sum of a [40, 24] tensor beside k casts to bf16 of tensors of other shapes."""
    x = torch.randn(40, 24, device=device)
    others = [torch.randn(3 + 2 * i, 5, device=device) for i in range(k)]
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        tx = fd.from_pytorch(x)
        ts = [fd.from_pytorch(t) for t in others]
        fd.add_output(fd.ops.sum(tx, [1]))
        for t in ts:
            fd.add_output(fd.ops.cast(t, DataType.BFloat16))

    def eager(x, *os):
        return [x.sum(1)] + [o.bfloat16() for o in os]
    return fs, [x, *others], eager


def check_against_eager(outs, want) -> None:
    assert len(outs) == len(want)
    for i, (g, w) in enumerate(zip(outs, want)):
        assert g.dtype == w.dtype, (i, g.dtype, w.dtype)
        assert tuple(g.shape) == tuple(w.shape), (i, g.shape, w.shape)
        if w.dtype.is_floating_point and w.dtype not in (torch.bfloat16, torch.float16):
            torch.testing.assert_close(g, w, msg=f"output {i}")
        else:                                  # casts: bit-exact
            assert torch.equal(g, w), f"output {i}"
        if w.numel() > 1:
            nontrivial = [a for a, n in enumerate(w.shape) if n != 1]
            assert [g.stride(a) for a in nontrivial] == [w.stride(a) for a in nontrivial], \
                (i, g.stride(), w.stride())
