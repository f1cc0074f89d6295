"""The embedding_backward kernel on CUDA (tests/cpu/test_embedding_backward.py on the GPU, at a
transformer's sizes: indices up to [8, 512], H 768, up to 30522 rows): close to eager's
embedding_dense_backward, bit-identical from run to run (no atomics), bit-equal to the CPU
interpreter's result on a small case, and an index outside the table traps (in a child process:
the CUDA context is lost)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from pyfuser.ir import builder as B
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.fusion import Fusion
from pyfuser.runtime import dispatch

pytestmark = pytest.mark.gpu
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cpu"))
from test_embedding_backward import sequential_reference  # noqa: E402


def _fusion(grad, ids, num_weights, padding_idx):
    f = Fusion()
    with f:
        g = B.define_tensor([-1] * grad.dim(), DataType.from_torch(grad.dtype))
        i = B.define_tensor([-1] * ids.dim(), DataType.from_torch(ids.dtype))
        f.add_output(B.embedding_backward(g, i, num_weights, padding_idx))
    return f


def _run(f, grad, ids):
    (out,) = dispatch.execute_fusion(f, [grad, ids])
    report = dispatch.last_report(f)
    assert report is None or (report.kernels == 1 and report.eager_segments == 0), report
    return out


def _inputs(shape, hidden, vocab, dtype, index_dtype=torch.int64, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    ids = torch.randint(0, vocab, shape, generator=g, device="cuda", dtype=index_dtype)
    grad = torch.randn(*shape, hidden, generator=g, device="cuda").to(dtype)
    return grad, ids


CASES = [((8, 512), 768, 30522), ((8, 512), 768, 8192), ((1, 512), 768, 512),
         ((8, 512), 768, 2), ((4, 100), 1100, 300)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,hidden,vocab", CASES)
def test_matches_eager_and_is_deterministic(dtype, shape, hidden, vocab):
    grad, ids = _inputs(shape, hidden, vocab, dtype)
    if vocab == 2:
        ids.zero_()                                    # BERT's token types: one long run
    padding = 0 if vocab > 2 else -1
    f = _fusion(grad, ids, vocab, padding)
    a = _run(f, grad, ids)
    b = _run(f, grad, ids)
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))      # run to run, bit for bit
    eager = torch.ops.aten.embedding_dense_backward(grad, ids, vocab, padding, False)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(a, eager, rtol=tol, atol=tol * max(1.0, shape[-1] / 64))
    want = sequential_reference(grad.cpu(), ids.cpu(), vocab, padding)
    assert torch.equal(a.cpu().view(torch.uint8), want.view(torch.uint8))


def test_equals_the_interpreter_bits():
    grad, ids = _inputs((4, 96), 200, 70, torch.bfloat16, torch.int32, seed=3)
    f = _fusion(grad, ids, 70, 5)
    gpu = _run(f, grad, ids).cpu()
    (cpu,) = dispatch.execute_fusion(f, [grad.cpu(), ids.cpu()], "interpret")
    assert torch.equal(gpu.view(torch.uint8), cpu.view(torch.uint8))


def test_an_index_outside_the_table_traps():
    code = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {HERE!r})
        from test_embedding_backward_gpu import _fusion, _run
        grad = torch.randn(64, 32, device="cuda")
        ids = torch.randint(0, 10, (64,), device="cuda")
        ids[17] = 10
        _run(_fusion(grad, ids, 10, -1), grad, ids)
        torch.cuda.synchronize()
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0
    assert "embedding_dense_backward: index out of range" in r.stdout + r.stderr


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tied_weights_gradient_in_the_epilogue(dtype):
    """embedding_backward + the projection's gradient (BERT's sizes): one kernel, the bits of
    the interpreter's and of the sequential sum rounded, then eager's add."""
    grad, ids = _inputs((8, 512), 768, 30522, dtype, seed=4)
    other = torch.randn(30522, 768, device="cuda").to(dtype)
    f = Fusion()
    with f:
        g = B.define_tensor([-1, -1, -1], DataType.from_torch(dtype))
        i = B.define_tensor([-1, -1], DataType.Int)
        o = B.define_tensor([-1, -1], DataType.from_torch(dtype))
        f.add_output(B.elementwise("add", o, B.embedding_backward(g, i, 30522, 0)))
    (out,) = dispatch.execute_fusion(f, [grad, ids, other])
    report = dispatch.last_report(f)
    assert report is None or (report.kernels == 1 and report.eager_segments == 0), report
    want = other.cpu() + sequential_reference(grad.cpu(), ids.cpu(), 30522, 0)
    assert torch.equal(out.cpu(), want), (out.cpu() - want).abs().max()
