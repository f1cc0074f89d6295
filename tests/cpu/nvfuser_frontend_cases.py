"""Programs in the style of nvFuser's frontend test suites, shared by the CPU tests
(test_nvfuser_frontend.py) and the GPU tests (tests/gpu/test_nvfuser_frontend_gpu.py).

Each case: fusion(fd, inputs) defines the fusion (any form of the frontend), inputs(device) makes
its inputs, eager(inputs) gives the expected outputs with eager PyTorch.
"""
import torch

from pyfuser import DataType

CASES = {}


def case(inputs):
    def register(fn):
        CASES[fn.__name__] = (fn, inputs, fn.eager)
        return fn
    return register


def _eager(f):
    def attach(fn):
        fn.eager = f
        return fn
    return attach


def randn(*shape, device, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)


def randint(high, shape, device, seed=0):
    """Seeded as randn: a case's inputs are the same on every call (its tests call it twice)."""
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed)).to(device)


@case(lambda d: [randn(2, 4, 8, device=d), randn(2, 4, 8, device=d, seed=1)])
@_eager(lambda x: [torch.sum((x[0] + x[1]) * 3.0, dim=-1)])
def basic_sum(fd, x):
    t0, t1 = fd.define_tensor(3), fd.define_tensor(3)
    t3 = fd.ops.mul(fd.ops.add(t0, t1), fd.define_constant(3.0))
    fd.add_output(fd.ops.sum(t3, [-1], False, DataType.Float))


@case(lambda d: [randn(2, 4, 8, device=d, dtype=torch.float16),
                 randn(2, 4, 8, device=d, dtype=torch.float16, seed=1)])
@_eager(lambda x: [torch.sum(((x[0] + x[1]) * 3.0).float(), dim=-1).half()])
def basic_fp16(fd, x):
    t0, t1 = fd.define_tensor(3, DataType.Half), fd.define_tensor(3, DataType.Half)
    t4 = fd.ops.sum(fd.ops.mul(fd.ops.add(t0, t1), fd.define_constant(3.0)), [-1], False,
                    DataType.Float)
    fd.add_output(fd.ops.cast(t4, DataType.Half))


@case(lambda d: [randn(3, device=d), randn(2, 3, 4, device=d, seed=1)])
@_eager(lambda x: [x[0][None, :, None] + x[1], x[1] - x[0][None, :, None]])
def broadcast_forms(fd, x):
    t0 = fd.from_pytorch(x[0])
    t1 = fd.define_tensor(sizes=x[1].size(), strides=x[1].stride())
    fd.add_output(fd.ops.add(fd.ops.broadcast_in_dim(t0, [2, 3, 4], [1]), t1))
    sizes = fd.ops.tensor_sizes(t1)
    fd.add_output(t1 - fd.ops.broadcast_in_dim(t0, sizes, [1]))


@case(lambda d: [randn(1, 3, device=d), randn(2, 1, device=d, seed=1)])
@_eager(lambda x: [x[0] + x[1]])
def sizes_of_both_operands(fd, x):
    t0 = fd.define_tensor(symbolic_sizes=[1, -1], contiguous=[True, True])
    t1 = fd.define_tensor([-1, 1], [True, True])
    s0, s1 = fd.ops.tensor_sizes(t0), t1.shape()
    shape = [s1[0], s0[1]]
    fd.add_output(fd.ops.add(fd.ops.broadcast_in_dim(t0, shape, [0, 1]),
                             fd.ops.broadcast_in_dim(t1, shape, [0, 1])))


@case(lambda d: [randn(4, 6, 8, device=d), randn(8, device=d, seed=1), randn(8, device=d, seed=2)])
@_eager(lambda x: [torch.nn.functional.layer_norm(x[0], [8], x[1], x[2], 1e-5)])
def layer_norm(fd, x):
    t = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
    w, b = fd.from_pytorch(x[1]), fd.from_pytorch(x[2])
    var, mean = fd.ops.var_mean(t, [2], 0, True)
    invstd = fd.ops.rsqrt(var + fd.define_scalar(1e-5))
    y = (t - mean) * invstd
    shape = t.shape
    fd.add_output(y * fd.ops.broadcast_in_dim(w, shape, [2]) +
                  fd.ops.broadcast_in_dim(b, shape, [2]))


@case(lambda d: [randn(4, 16, device=d), torch.tril(torch.ones(16, 16, device=d))])
@_eager(lambda x: [torch.softmax((x[0] * 0.5).masked_fill(x[1][:4] == 0, float("-inf")), -1)])
def masked_softmax(fd, x):
    t0 = fd.from_pytorch(x[0])
    mask = fd.ops.slice(fd.from_pytorch(x[1]), [0, 0], [4, 16], [1, 1])
    t = fd.ops.where(fd.ops.eq(fd.define_constant(0.0), mask), float("-inf"), t0 * 0.5)
    m = fd.ops.broadcast_in_dim(fd.ops.max(t, axes=[1], keepdim=False, dtype=DataType.Null),
                                output_shape=[4, 16], broadcast_dims=[0])
    e = fd.ops.exp(t - m)
    fd.add_output(e / fd.ops.broadcast_in_dim(fd.ops.sum(e, [1]), [4, 16], [0]))


@case(lambda d: [randn(8, 16, device=d), randint(8, (4, 16), d), randint(16, (5,), d, seed=1)])
@_eager(lambda x: [torch.gather(x[0] * 2, 0, x[1]), torch.index_select(x[0], 1, x[2])])
def gather_index_select(fd, x):
    t0, idx, sel = (fd.from_pytorch(v) for v in x)
    fd.add_output(fd.ops.gather(t0 * 2, idx, 0))
    fd.add_output(fd.ops.index_select(t0, sel, 1))


@case(lambda d: [randn(2, 4, device=d), randn(2, 3, device=d, seed=1)])
@_eager(lambda x: [torch.cat([x[0], x[1]], 1), x[0][:, 1:3] + 1])
def cat_and_slice(fd, x):
    t0, t1 = fd.from_pytorch(x[0]), fd.from_pytorch(x[1])
    fd.add_output(fd.ops.cat([t0, t1], 1))
    fd.add_output(fd.ops.slice(t0, start_indices=[0, 1], end_indices=[2, 3]) + 1)


@case(lambda d: [torch.randn(5, dtype=torch.complex64, generator=torch.Generator().manual_seed(3))
                 .to(d)])
@_eager(lambda x: [x[0].real, x[0].imag, x[0].rsqrt(), x[0] * (3 + 0.5j), torch.sum(x[0] * 2)])
def complex_ops(fd, x):
    t0 = fd.from_pytorch(x[0])
    fd.add_output(t0.real())
    fd.add_output(fd.ops.imag(t0))
    fd.add_output(fd.ops.rsqrt(t0))
    fd.add_output(t0 * fd.define_constant(complex(3.0, 0.5)))
    fd.add_output(fd.ops.sum(t0 * 2, [0], False, DataType.ComplexFloat))


@case(lambda d: [randn(3, 4, 5, device=d)])
@_eager(lambda x: [-x[0], abs(x[0]), x[0] * (1.0 - x[0] * x[0]) / abs(x[0]) + 2.0,
                   torch.addcmul(-x[0], abs(x[0]), x[0].relu(), value=-0.5),
                   x[0].reshape(12, 5).sum(0).double()])
def operators_and_methods(fd, x):
    t0 = fd.from_pytorch(x[0])
    c0 = fd.define_constant(1.0)
    c1 = -c0
    t1 = -t0
    t2 = abs(t0)
    fd.add_output(t1)
    fd.add_output(t2)
    fd.add_output(-t1 * (c0 - t0 * t0) / t2 + abs(c1) ** c1 + 1.0)
    half = fd.define_constant(0.5)
    fd.add_output(t1.addcmul(t2, t0.relu(), half.neg()))
    fd.add_output(t0.reshape([3, 4, 5], [12, 5]).sum([0]).cast(DataType.Double))


@case(lambda d: [torch.ones(4, 4, device=d)])
@_eager(lambda x: [x[0] + 1.0, x[0] + 5.0])
def alias_output(fd, x):
    t0 = fd.from_pytorch(x[0])
    t2 = t0 + 2.0
    fd.add_output(t0 + 1.0)
    fd.add_output(t2, alias_input=t0)
    fd.add_output(t2 + 3.0)


@case(lambda d: [torch.arange(24, dtype=torch.float32, device=d).reshape(2, 3, 4)])
@_eager(lambda x: [x[0] + 3.0, x[0] * 2])
def output_stride_order(fd, x):
    t0 = fd.from_pytorch(x[0])
    fd.add_output(t0 + 3.0, [2, 0, 1])
    fd.add_output(t0 * 2, stride_order=[0, 1, 2])


@case(lambda d: [torch.tensor(1.5), randn(5, 5, 5, device=d),
                 randint(2, (5, 5), d).bool().unsqueeze(-1).expand(5, 5, 5)])
@_eager(lambda x: [x[0].to(x[1].device) + x[1] + x[2]])
def expanded_and_cpu_scalar_inputs(fd, x):
    t0, t1, t2 = (fd.from_pytorch(v) for v in x)
    fd.add_output(fd.ops.add(t2, fd.ops.add(t0, t1)))


@case(lambda d: [2.0, 3.0])
@_eager(lambda x: [torch.full([2, 2], 5.0), torch.arange(3, dtype=torch.int32) * 2 + 100])
def scalar_inputs_full_iota(fd, x):
    s0, s1 = fd.define_scalar(), fd.define_scalar(DataType.Double)
    t3 = fd.ops.full(size=[2, 2], arg=fd.define_constant(1.0, DataType.Float), dtype=DataType.Float)
    fd.add_output(fd.ops.mul(t3, fd.ops.add(s0, s1)))
    fd.add_output(fd.ops.iota(fd.define_constant(3), fd.define_constant(100),
                              fd.define_constant(2), DataType.Int32))
