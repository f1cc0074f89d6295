"""`pyfuser explain` on CUDA: kernels launched for real, `--bench` times each against a copy of
the same bytes; the traced BERT's HTML report on CUDA."""
import json
import pathlib
import sys

import pytest
import torch

import pyfuser
from pyfuser.cli import main

pytestmark = pytest.mark.gpu
SEED003 = "examples/seed003_bn_add_relu.ir"


def test_explain_bench_on_cuda(capsys):
    assert main(["explain", SEED003, "--device", "cuda", "--bench", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["device"] == "cuda" and d["executor"] == "cuda"
    kernels = [s["kernel"] for g in d["groups"] for s in g["segments"] if s["kernel"]]
    assert len(kernels) == 1
    b = kernels[0]["bench"]
    assert b["us"] > 0 and b["copy_us"] > 0 and 10 < b["pct_of_copy"] < 200
    # 2 x [8, 256, 56, 56] float32 in (+ 8 per-channel [256] parameters), one out
    n = 8 * 256 * 56 * 56 * 4
    assert kernels[0]["bytes_in"] == 2 * n + 8 * 256 * 4 and kernels[0]["bytes_out"] == n
    assert main(["explain", SEED003, "--device", "cuda", "--bench"]) == 0
    assert "% of a same-size copy's rate" in capsys.readouterr().out


def test_explain_traced_bert_on_cuda(tmp_path):
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "cpu"))
    import model_corpus as M
    case = next(c for c in M.CASES if c.name.startswith("bert"))
    if not M.available(case):
        pytest.skip(f"{case.needs} is not installed")
    model, inputs = case.build("cuda", scale=4)
    traced = M.compile_case(case, model, inputs)
    f = pyfuser.jit(traced)
    with torch.no_grad():
        f(*inputs)
        e = pyfuser.explain(traced, *inputs, bench=True)
    assert e.device == "cuda" and len(e.groups) == f.last_run.groups
    assert all(k.bench and k.bench["us"] > 0 for k in e.kernels)
    page = e.to_html(tmp_path / "bert.html")
    assert all(f'data-group="{g.index}"' in page for g in e.groups)
