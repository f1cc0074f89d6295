"""Bad input: each mistake raises FusionDefinitionError / ExecuteError naming what was wrong,
at definition time where that is knowable; no raw KeyError/IndexError/AttributeError escapes."""
import pytest
import torch

from pyfuser import DataType, Fusion, FusionDefinition
from pyfuser.errors import ExecuteError, FusionDefinitionError


def define(fn) -> Fusion:
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        fn(fd)
    return fs


def simple(fd):
    t = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Float)
    fd.add_output(fd.ops.relu(t))


DEFINITION_ERRORS = {
    "view sizes": (lambda fd, t: fd.ops.view(t, original_shape=[4, 6], new_shape=[5, 5]),
                   "view: original_shape [4, 6] has 24 elements but new_shape [5, 5] has 25"),
    "view rank": (lambda fd, t: fd.ops.view(t, original_shape=[24], new_shape=[24]),
                  "original_shape [24] has 1 entries; T0_g has rank 2"),
    "bad dtype for op": (lambda fd, t: fd.ops.bitwise_and(t, t), "bitwise_and: does not take Float"),
    "bool sub": (lambda fd, t: fd.ops.sub(fd.ops.gt(t, 0.0), 1), "sub: does not take Bool"),
    "unknown op": (lambda fd, t: fd.ops.frobnicate(t), "fd.ops has no op named 'frobnicate'"),
    "bare permute": (lambda fd, t: fd.permute(t), "permute needs dims="),
    "bad permute": (lambda fd, t: fd.ops.permute(t, dims=[0, 0]), "permute: dims [0, 0]"),
    "arity": (lambda fd, t: fd.ops.add(t), "add: takes 2 operands, got 1"),
    "not a tensor": (lambda fd, t: fd.ops.exp("x"), "exp: operand of type str"),
    "output scalar": (lambda fd, t: fd.add_output(fd.define_constant(1.0)), "add_output: expects a tensor"),
    "output list": (lambda fd, t: fd.add_output([t]), "add_output: expects a tensor"),
    "symbolic size": (lambda fd, t: fd.define_tensor(symbolic_sizes=[-1, -2]), "size 1 is -2"),
    "no sizes": (lambda fd, t: fd.define_tensor(dtype=DataType.Float), "exactly one of symbolic_sizes="),
    "contiguity length": (lambda fd, t: fd.define_tensor(symbolic_sizes=[-1], contiguous=[True, True]),
                          "contiguity has 2 entries for a rank-1 tensor"),
    "dtype type": (lambda fd, t: fd.define_tensor(symbolic_sizes=[-1], dtype=torch.float32),
                   "dtype must be a DataType"),
    "constant value": (lambda fd, t: fd.define_constant("1.0"), "define_constant: value must be a Python number"),
    "cast dtype": (lambda fd, t: fd.ops.cast(t, dtype="float"), "cast needs dtype="),
    "reduction axis": (lambda fd, t: fd.ops.sum(t, axes=[5]), "sum: dim 5 out of range for rank 2"),
    "squeeze non-1": (lambda fd, t: fd.ops.squeeze(t, dims=[0]), "squeeze: axis 0 of T0_g is not of size 1"),
    "expand non-bcast": (lambda fd, t: fd.ops.expand(t, [3, 4, 5]), "expand: 3 sizes for a rank-2 tensor"),
    "scalar arg": (lambda fd, t: fd.ops.leaky_relu(t, t), "leaky_relu: operand 1 must be a scalar"),
    "where cond": (lambda fd, t: fd.ops.where(t, t, t), "where: condition must be Bool"),
    "unknown attr": (lambda fd, t: fd.define_tensr(), "FusionDefinition has no attribute 'define_tensr'"),
}


@pytest.mark.parametrize("case", sorted(DEFINITION_ERRORS))
def test_definition_errors(case):
    fn, message = DEFINITION_ERRORS[case]
    fs = Fusion()
    with pytest.raises(FusionDefinitionError) as info:
        with FusionDefinition(fs) as fd:
            t = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Float)
            fn(fd, t)
    assert message in str(info.value)


def test_tensor_from_another_fusion():
    fs1 = Fusion()
    with FusionDefinition(fs1) as fd1:
        t1 = fd1.define_tensor(symbolic_sizes=[-1], dtype=DataType.Float)
        fd1.add_output(fd1.ops.exp(t1))
    with pytest.raises(FusionDefinitionError, match="fd.ops.add: operand T0 belongs to another "
                                                    "FusionDefinition"):
        with FusionDefinition(Fusion()) as fd2:
            t2 = fd2.define_tensor(symbolic_sizes=[-1], dtype=DataType.Float)
            fd2.ops.add(t2, t1)


def test_no_output_and_use_after_exit():
    with pytest.raises(FusionDefinitionError, match="no outputs"):
        with FusionDefinition(Fusion()) as fd:
            fd.define_tensor(symbolic_sizes=[-1], dtype=DataType.Float)
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        simple(fd)
    with pytest.raises(FusionDefinitionError, match="inside `with FusionDefinition"):
        fd.ops.exp(fs.ir_fusion.inputs[0])
    with pytest.raises(FusionDefinitionError, match="already defined"):
        with FusionDefinition(fs) as fd:
            simple(fd)


EXECUTE_ERRORS = {
    "count": ([], "the fusion takes 1 inputs, got 0"),
    "rank": ([torch.randn(3)], "input 0 (T0_g) must have rank 2, got shape (3,)"),
    "dtype": ([torch.randn(3, 2, dtype=torch.float64)], "must be torch.float32, got torch.float64"),
    "not a tensor": (["x"], "input 0 (T0_g) must be a tensor, got str"),
}


@pytest.mark.parametrize("case", sorted(EXECUTE_ERRORS))
def test_execute_errors(case):
    inputs, message = EXECUTE_ERRORS[case]
    fs = define(simple)
    with pytest.raises(ExecuteError) as info:
        fs.execute(inputs)
    assert message in str(info.value)


def test_execute_errors_on_sizes_and_undefined_fusion():
    with pytest.raises(ExecuteError, match="not defined yet"):
        Fusion().execute([torch.randn(2)])

    def viewed(fd):
        t = fd.define_tensor(symbolic_sizes=[-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.view(t, original_shape=[4, 6], new_shape=[2, 12]))
    with pytest.raises(ExecuteError, match="view of a tensor of shape \\[5, 5\\]"):
        define(viewed).execute([torch.randn(5, 5)])

    def added(fd):
        a = fd.define_tensor(symbolic_sizes=[-1], dtype=DataType.Float)
        b = fd.define_tensor(symbolic_sizes=[-1], dtype=DataType.Float)
        fd.add_output(fd.ops.add(a, b))
    with pytest.raises(ExecuteError, match="operands of add have sizes \\[3, 4\\]"):
        define(added).execute([torch.randn(3), torch.randn(4)])

    def bcast(fd):
        a = fd.define_tensor(symbolic_sizes=[1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.neg(a))
    with pytest.raises(ExecuteError, match="axis 0 was defined as broadcast"):
        define(bcast).execute([torch.randn(2, 3)])
    with pytest.raises(ExecuteError, match="inputs must be a list"):
        define(simple).execute(torch.randn(2, 2))
