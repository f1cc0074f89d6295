"""More HF transformers architectures through the torch.compile backend on the CPU, each too slow
for the default suite (7-40 s: their compiles, or Dynamo graph breaks the models' own code
makes): opt-in with PYFUSER_MODEL_ZOO=1 (`PYFUSER_MODEL_ZOO=1 pytest tests/cpu/test_model_zoo.py`).

Per model (random weights from a seeded init, never a download; dropout 0): an inference
forward under no_grad and a training step (forward, loss, backward) through pyfuser beside eager
in float32 and in float64 (the judge): every output, the loss and every parameter gradient as
close to float64 as eager's (train_corpus.assert_as_close_as_eager), and as many Dynamo graphs
as with backend="eager" (a graph break is the model's, never the backend's).
The faster architectures run in test_compile_training.py (train_corpus.TRAIN_CASES)."""
from __future__ import annotations

import copy
import logging
import os
import warnings

import pytest
import torch

import pyfuser

import train_corpus as TC
from train_corpus import assert_as_close_as_eager

pytestmark = [pytest.mark.usefixtures("fresh_compile"),
              pytest.mark.skipif(not os.environ.get("PYFUSER_MODEL_ZOO"),
                                 reason="slow: set PYFUSER_MODEL_ZOO=1 to run")]

S = TC.SMALL
_DEC = dict(use_cache=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
_LLAMA = dict(hidden_size=S.hidden, intermediate_size=2 * S.hidden, num_hidden_layers=S.layers,
              num_attention_heads=S.heads, num_key_value_heads=1, max_position_embeddings=64,
              **_DEC)


def _lm(config, model_class, padded=False, **cfg):
    def build():
        import transformers as T
        logging.getLogger("transformers").setLevel(logging.ERROR)
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = getattr(T, model_class)(getattr(T, config)(vocab_size=S.vocab, **cfg))
        ids, labels = TC.token_batch(S, "cpu")
        inputs = {"input_ids": ids, "labels": labels}
        if padded:
            inputs["attention_mask"] = TC.padding_mask(ids, S)
        return model, inputs
    return build


MODELS = {
    # DeepSeek-V3: multi-head latent attention (keys assembled by copies into a new buffer, a
    # permuted source: the transpose kernel's tensor positions) and routed experts (graph
    # breaks at the model's nonzero)
    "deepseek_v3": _lm("DeepseekV3Config", "DeepseekV3ForCausalLM", n_routed_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                       first_k_dense_replace=1, n_group=1, topk_group=1,
                       experts_implementation="eager", kv_lora_rank=16, q_lora_rank=16,
                       qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                       **{**_LLAMA, "num_key_value_heads": S.heads}),
    "gpt_neox": None,
    "bart": None,
    # Gemma-2 with eager attention: soft-capped logits (tanh), sliding windows, GeGLU
    "gemma2": _lm("Gemma2Config", "Gemma2ForCausalLM", head_dim=16, sliding_window=4,
                  attn_implementation="eager", **_LLAMA),
    # DeBERTa-v2: disentangled relative attention (gathers of the position scores)
    "deberta_v2": None,
    # Mamba: the selective scan's Python loop (no CUDA kernels), depthwise conv1d, softplus
    "mamba": _lm("MambaConfig", "MambaForCausalLM", hidden_size=S.hidden, state_size=8,
                 num_hidden_layers=2, expand=2, conv_kernel=4, use_cache=False, bos_token_id=1,
                 eos_token_id=2, pad_token_id=0),
}


def _build(name):
    if MODELS[name] is None:                      # a train_corpus case
        case = TC.TRAIN_CASES[name]("cpu")
        return case.model, case.inputs
    return MODELS[name]()


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return [t for e in out for t in _tensors(e)] if isinstance(out, (tuple, list)) else []


def _f64(inputs):
    return {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}


class _Count:
    def __init__(self, inner=None):
        self.inner, self.graphs = inner, 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return self.inner(gm, example_inputs) if self.inner else gm.forward


def _graphs(model, inputs, backend, train):
    torch._dynamo.reset()
    count = _Count(backend)
    with torch.set_grad_enabled(train):
        out = torch.compile(model, backend=count)(**inputs)
    return count.graphs, out


@pytest.mark.parametrize("name", list(MODELS))
def test_inference_matches_eager(name):
    model, inputs = _build(name)
    model.eval()
    ours, ref, ora = copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model).double()
    graphs, out = _graphs(ours, inputs, pyfuser.backend, train=False)
    eager_graphs, _ = _graphs(copy.deepcopy(model), inputs, None, train=False)
    assert graphs == eager_graphs
    with torch.no_grad():
        got, want, oracle = _tensors(out), _tensors(ref(**inputs)), _tensors(ora(**_f64(inputs)))
    assert len(got) == len(want) >= 1
    for k, (g, w, o) in enumerate(zip(got, want, oracle)):
        assert_as_close_as_eager(g, w, o, f"output {k}")


@pytest.mark.parametrize("name", list(MODELS))
def test_training_step_matches_eager(name):
    model, inputs = _build(name)
    runs = [copy.deepcopy(model).train(), copy.deepcopy(model).train(),
            copy.deepcopy(model).train().double()]
    graphs, out = _graphs(runs[0], inputs, pyfuser.backend, train=True)
    losses = [out.loss, runs[1](**inputs).loss, runs[2](**_f64(inputs)).loss]
    for loss in losses:
        loss.backward()
    assert_as_close_as_eager(*losses, "loss")
    grads = [TC.grads(m) for m in runs]
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for k in grads[1]:
        assert_as_close_as_eager(grads[0][k], grads[1][k], grads[2][k], k)
    eager_graphs, _ = _graphs(copy.deepcopy(model).train(), inputs, None, train=True)
    assert graphs == eager_graphs
