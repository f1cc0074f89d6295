"""Embedding lookups read inside pointwise kernels on CUDA (tests/cpu/test_gather_fusion.py on
the GPU, at a transformer's sizes): GPT-2's token and position embeddings and their add are one
kernel through torch.compile, equal to eager's bit for bit in float32 and bfloat16 (a training
step's gradients too); an index outside the table stops the kernel with a device-side trap, as
eager's lookup does with its assert (in a child process: the CUDA context is lost)."""
import subprocess
import sys
import textwrap

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.runtime import dispatch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_compile")]


def _one_kernel_run(m, *args):
    """(pyfuser's result after warm-up calls, eager's) of module m under torch.no_grad(),
    checking that the compiled graph is one region that ran as one kernel."""
    f = pyfuser.compile(m)
    with torch.no_grad():
        for _ in range(3):
            got = f(*args)
        want = m(*args)
    (g,) = compiled_graphs()
    assert not g.unsupported and len(g.regions) == 1
    report = dispatch.last_report(g.regions[0].fusion)
    assert report is None or (report.kernels == 1 and report.eager_segments == 0), report
    return got, want


class _Embeddings(torch.nn.Module):
    def __init__(self, vocab=50257, positions=1024, hidden=768):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, hidden)
        self.wpe = torch.nn.Embedding(positions, hidden)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        return self.wte(ids) + self.wpe(pos)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpt2_embeddings_are_one_kernel_on_cuda(dtype):
    m = _Embeddings().cuda().to(dtype)
    got, want = _one_kernel_run(m, torch.randint(0, 50257, (8, 512), device="cuda"))
    assert got.dtype == want.dtype and got.stride() == want.stride()
    assert torch.equal(got, want)


class _BertEmbeddings(torch.nn.Module):
    def __init__(self, hidden=768):
        super().__init__()
        self.words, self.types = torch.nn.Embedding(30522, hidden), torch.nn.Embedding(2, hidden)
        self.places, self.norm = torch.nn.Embedding(512, hidden), torch.nn.LayerNorm(hidden)

    def forward(self, ids, tt):
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        return self.norm(self.words(ids) + self.types(tt) + self.places(pos))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bert_embeddings_and_layer_norm_are_one_kernel_on_cuda(dtype):
    m = _BertEmbeddings().cuda().to(dtype)
    ids = torch.randint(0, 30522, (8, 512), device="cuda")
    got, want = _one_kernel_run(m, ids, torch.randint(0, 2, (8, 512), device="cuda"))
    tol = dict(rtol=1e-5, atol=1e-5) if dtype is torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got, want, **tol)


def test_embedding_training_gradients_on_cuda():
    torch.manual_seed(0)
    m = _Embeddings(1000, 64, 128).cuda()
    ref = _Embeddings(1000, 64, 128).cuda()
    ref.load_state_dict(m.state_dict())
    ids = torch.randint(0, 1000, (4, 64), device="cuda")
    w = torch.randn(4, 64, 128, device="cuda")
    (pyfuser.compile(m)(ids) * w).sum().backward()
    (ref(ids) * w).sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_an_index_outside_the_table_traps_on_cuda():
    code = textwrap.dedent("""
        import torch
        from pyfuser.ir import builder as B
        from pyfuser.ir.dtypes import DataType
        from pyfuser.ir.fusion import Fusion
        from pyfuser.runtime import dispatch
        f = Fusion()
        with f:
            t = B.define_tensor([-1, 64], DataType.Float)
            i = B.define_tensor([-1], DataType.Int)
            f.add_output(B.elementwise("add", B.embedding(t, i), 1.0))
        t = torch.randn(10, 64, device="cuda")
        i = torch.arange(10, device="cuda")
        (out,) = dispatch.execute_fusion(f, [t, i])
        assert torch.equal(out, t + 1)
        i[3] = 10
        (out,) = dispatch.execute_fusion(f, [t, i])
        torch.cuda.synchronize()
        print("NO ERROR")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "NO ERROR" not in r.stdout, (r.stdout, r.stderr[-2000:])
    # the trap fails the launch; the kernel's printf names the index where the driver flushes it
    out = r.stdout + r.stderr
    assert "index out of range" in out or "CUDA error" in out, (r.stdout, r.stderr[-2000:])


class _HFBertEmbeddings(_BertEmbeddings):
    """Token types as HF BERT's code takes them without token_type_ids: gathered from a buffer
    at the positions (a lookup whose value is the token-type embedding's index)."""
    def __init__(self):
        super().__init__()
        self.register_buffer("token_type_ids", torch.zeros(1, 512, dtype=torch.long),
                             persistent=False)

    def forward(self, ids):
        b, s = ids.shape
        pos = torch.arange(s, device=ids.device).unsqueeze(0)
        tt = torch.gather(self.token_type_ids.expand(1, -1), 1, pos).expand(b, s)
        return self.norm(self.words(ids) + self.types(tt) + self.places(pos))


def test_bert_token_type_gather_joins_the_embeddings_kernel_on_cuda():
    m = _HFBertEmbeddings().cuda()
    with torch.no_grad():
        m.token_type_ids[0, 100:300] = 1
    got, want = _one_kernel_run(m, torch.randint(0, 30522, (8, 512), device="cuda"))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
