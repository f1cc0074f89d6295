"""Fusions of seed 002 (bookend views), shared by the CPU and GPU segmenter tests, and the small
`mul_add` of the fast-path tests.

Each builder takes the sizes so the CPU tests use small ones and the GPU tests the seed's."""
import itertools

import torch

from pyfuser.frontend.definition import Fusion, FusionDefinition
from pyfuser.ir import DataType
from pyfuser.ir import builder as B
from pyfuser.ir import Fusion as IRFusion

SMALL_GELU = (64, 48, (4, 16, 48))           # [N, H] -> view [a, b, H]
FULL_GELU = (8192, 3072, (64, 128, 3072))
SMALL_TR = ((24, 8, 4), (2, 12, 8, 4), (2, 8, 48), (16, 48))
FULL_TR = ((768, 128, 64), (64, 12, 128, 64), (64, 128, 768), (8192, 768))


def mul_add():
    """a + b * c on three 1-D float32 inputs (the fast-path and native-runner tests)."""
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        a, b, c = (fd.define_tensor(symbolic_sizes=[-1], contiguous=[True], dtype=DataType.Float)
                   for _ in range(3))
        fd.add_output(fd.ops.add(a, fd.ops.mul(b, c)))
    return fs


def gelu(sizes=SMALL_GELU, views=True, two_outputs=False):
    n, h, mid = sizes
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        T0 = fd.define_tensor(symbolic_sizes=[-1, -1] if views else [-1, -1, -1],
                              contiguous=[True] * (2 if views else 3), dtype=DataType.Float)
        T1 = fd.ops.view(T0, original_shape=[n, h], new_shape=list(mid)) if views else T0
        T3 = fd.ops.mul(T1, fd.define_constant(0.5))
        T6 = fd.ops.erf(fd.ops.mul(T1, fd.define_constant(0.707107)))
        T9 = fd.ops.mul(T3, fd.ops.add(T6, fd.define_constant(1.0)))
        T10 = fd.ops.view(T9, original_shape=list(mid), new_shape=[n, h]) if views else T9
        if two_outputs:
            fd.add_output(T1)
        fd.add_output(T10)
    return fs


def gelu_eager(x, sizes=SMALL_GELU, views=True):
    t1 = x.view(*sizes[2]) if views else x
    t9 = (t1 * 0.5) * (torch.erf(t1 * 0.707107) + 1.0)
    return t9.view(sizes[0], sizes[1]) if views else t9


def gelu_mid_view(sizes=SMALL_GELU):
    """GELU of x * 0.5 with the view between the ops: no bookend, the view stays in the kernel."""
    n, h, mid = sizes
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        T0 = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Float)
        T1 = fd.ops.view(fd.ops.mul(T0, fd.define_constant(0.5)), original_shape=[n, h],
                         new_shape=list(mid))
        T2 = fd.ops.erf(fd.ops.mul(T1, fd.define_constant(1.414214)))
        fd.add_output(fd.ops.mul(T1, fd.ops.add(T2, fd.define_constant(1.0))))
    return fs


def gelu_mid_view_eager(x, sizes=SMALL_GELU):
    t1 = (x * 0.5).view(*sizes[2])
    return t1 * (torch.erf(t1 * 1.414214) + 1.0)


def sequential(keep, sizes=SMALL_GELU):
    """Seed 002's views A, B, C around an add and a mul; keep = (A, B, C) booleans."""
    n, h, mid = sizes
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        cur, other = [n, h], list(mid)
        T = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Float)

        def view(t):
            nonlocal cur, other
            out = fd.ops.view(t, original_shape=cur, new_shape=other)
            cur, other = other, cur
            return out
        if keep[0]:
            T = view(T)
        T = fd.ops.add(T, T)
        if keep[1]:
            T = view(T)
        T = fd.ops.mul(T, T)
        if keep[2]:
            T = view(T)
        fd.add_output(T)
    return fs


def sequential_eager(x, keep, sizes=SMALL_GELU):
    shapes = [tuple(x.shape), sizes[2]]
    cur = 0

    def view(t):
        nonlocal cur
        cur = 1 - cur
        return t.reshape(shapes[cur])
    t = view(x) if keep[0] else x
    t = t + t
    t = view(t) if keep[1] else t
    t = t * t
    return view(t) if keep[2] else t


ALL_KEEPS = list(itertools.product([True, False], repeat=3))


def transpose(sizes=SMALL_TR):
    s0, s1, s4, s5 = sizes
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        T0 = fd.define_tensor(symbolic_sizes=[-1, -1, -1], contiguous=[True] * 3, dtype=DataType.Float)
        T1 = fd.ops.view(T0, original_shape=list(s0), new_shape=list(s1))
        T2 = fd.ops.permute(T1, dims=[0, 2, 1, 3])
        T3 = fd.ops.set(T2)
        T4 = fd.ops.view(T3, original_shape=[s1[0], s1[2], s1[1], s1[3]], new_shape=list(s4))
        fd.add_output(fd.ops.view(T4, original_shape=list(s4), new_shape=list(s5)))
    return fs


def transpose_eager(x, sizes=SMALL_TR):
    return x.view(*sizes[1]).permute(0, 2, 1, 3).reshape(*sizes[3])


def views_only():
    f = IRFusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        y = B.unsqueeze(B.permute(B.reshape(x, [4, 16, 48]), [2, 0, 1]), 0)
        f.add_output(y)
        f.add_output(B.reshape(x, [-1]))
        f.add_output(x)
    return f


def views_only_eager(x):
    return [x.reshape(4, 16, 48).permute(2, 0, 1).unsqueeze(0), x.reshape(-1), x]


def reduction_then_pointwise():
    """sum over axis 1, then an op with the input (a normalization: one kernel), and the sum
    viewed at the output (a host view)."""
    f = IRFusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        s = B.reduction("sum", x, [1], keepdim=True)
        y = B.elementwise("mul", B.elementwise("sub", x, s), B.constant(2.0))
        f.add_output(B.elementwise("relu", y))
        f.add_output(B.reshape(s, [-1]))
    return f


def two_reduction_domains():
    """sum over axis 0, then a sum over axis 1 of x - s: the two reductions reduce different
    axes and the row sum needs the column sums of every row first, so no one kernel takes both
    (the inner-outer scheduler takes column sums only at the end); the segmenter cuts between
    them."""
    f = IRFusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        s = B.reduction("sum", x, [0], keepdim=True)
        d = B.elementwise("sub", x, s)
        f.add_output(B.reduction("sum", B.elementwise("mul", d, d), [1]))
    return f


def two_domains_eager(x):
    d = x - x.sum(0, keepdim=True)
    return [(d * d).sum(1)]


def complex_reduction():
    """A reduction no kernel scheduler takes (complex dtype): an eager segment."""
    f = IRFusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.ComplexFloat)
        f.add_output(B.reduction("sum", x, [1]))
    return f


def reduction_eager(x):
    s = x.sum(1, keepdim=True)
    return [torch.relu((x - s) * 2.0), s.reshape(-1)]
