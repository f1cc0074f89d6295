"""Models for training steps through torch.compile: HF transformers BERT, DistilBERT, DeBERTa-v2
and MobileBERT (masked LM), ELECTRA (discriminator), GPT-2, Llama, BLOOM (ALiBi), OPT, Falcon,
GPT-NeoX, Mistral, Qwen2, Gemma and Phi (causal LM), T5 and BART (sequence to sequence), ViT,
ConvNeXt and Swin (image classification), CLIP (contrastive), Wav2Vec2 and the Whisper encoder
(audio classification) with random weights (never a download) and a ResNet-18 in train mode,
each with seeded inputs and a loss.

`TRAIN_CASES` maps a name to `build(device, size=SMALL, dropout=0.0) -> TrainCase`; `size` is a
`Size` (batch, sequence length or image size, hidden width, layers, heads): SMALL for the CPU
tests (the kernel interpreter), BENCH for bench/models.py (8 x 512, hidden 768, 4 layers).
`dropout` sets every dropout probability of the HF configs (0, the default, for comparisons
with eager: the masks of fused dropout come from pyfuser's Philox stream, not eager's; None
keeps the configs' own). BERT, GPT-2, Llama, T5, ViT and ResNet-18 are built here, the wider zoo in
train_corpus_zoo.py; what they share (sizes, TrainCase, seeded batches, `hf_model`,
`padding_mask`) is train_corpus_base.py's, re-exported here.

`step(case, model_fn, opt)` runs one training step (forward, loss, backward, optimizer step)
and returns the loss; `grads(model)` the gradients by parameter name.
`half_layer_norm_step` checks a half / bfloat16 LayerNorm's training step (no autocast).
Shared by tests/cpu/test_compile_training.py, tests/gpu/test_compile_gpu.py and bench/models.py.
"""
from __future__ import annotations

import copy

import torch

from train_corpus_base import (BENCH, SMALL, Size, TrainCase, dropout_args,  # noqa: F401
                               hf_model, padding_mask, seeded_generator, token_batch)
from train_corpus_zoo import ZOO_CASES


def _bert(device, size=SMALL, dropout=0.0):
    import transformers as T
    cfg = T.BertConfig(vocab_size=size.vocab, hidden_size=size.hidden,
                       num_hidden_layers=size.layers, num_attention_heads=size.heads,
                       intermediate_size=4 * size.hidden, max_position_embeddings=max(64, size.seq),
                       **dropout_args(dropout, "hidden_dropout_prob",
                                      "attention_probs_dropout_prob"))
    model = hf_model("BertForMaskedLM", cfg).to(device).train()
    ids, labels = token_batch(size, device)
    mask = torch.ones_like(ids)
    mask[-1, size.seq - 2:] = 0                     # a padded sequence: the mask takes part
    return TrainCase("bert", model, {"input_ids": ids, "attention_mask": mask, "labels": labels},
                     lambda out: out.loss)


def _gpt2(device, size=SMALL, dropout=0.0):
    import transformers as T
    cfg = T.GPT2Config(vocab_size=size.vocab, n_embd=size.hidden, n_layer=size.layers,
                       n_head=size.heads, n_positions=max(64, size.seq), use_cache=False,
                       bos_token_id=0, eos_token_id=0,
                       **dropout_args(dropout, "resid_pdrop", "embd_pdrop", "attn_pdrop"))
    model = hf_model("GPT2LMHeadModel", cfg).to(device).train()
    ids, labels = token_batch(size, device)
    return TrainCase("gpt2", model, {"input_ids": ids, "labels": labels}, lambda out: out.loss)


def _llama(device, size=SMALL, dropout=0.0):
    import transformers as T
    cfg = T.LlamaConfig(vocab_size=size.vocab, hidden_size=size.hidden,
                        intermediate_size=(8 * size.hidden) // 3 // 8 * 8,
                        num_hidden_layers=size.layers, num_attention_heads=size.heads,
                        num_key_value_heads=max(1, size.heads // 2),
                        max_position_embeddings=max(64, size.seq), use_cache=False,
                        bos_token_id=0, eos_token_id=0, pad_token_id=0,
                        **dropout_args(dropout, "attention_dropout"))
    model = hf_model("LlamaForCausalLM", cfg).to(device).train()
    ids, labels = token_batch(size, device)
    return TrainCase("llama", model, {"input_ids": ids, "labels": labels}, lambda out: out.loss)


def _t5(device, size=SMALL, dropout=0.0):
    """T5 as a sequence-to-sequence LM: encoder, decoder with cross-attention, relative position
    buckets, RMS norms (no mean, no bias), a ReLU feed-forward, shifted decoder inputs."""
    import transformers as T
    cfg = T.T5Config(vocab_size=size.vocab, d_model=size.hidden, d_kv=size.hidden // size.heads,
                     d_ff=4 * size.hidden, num_layers=size.layers, num_heads=size.heads,
                     relative_attention_num_buckets=8, use_cache=False,
                     decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                     **dropout_args(dropout, "dropout_rate"))
    model = hf_model("T5ForConditionalGeneration", cfg).to(device).train()
    ids, labels = token_batch(size, device)
    return TrainCase("t5", model, {"input_ids": ids, "labels": labels}, lambda out: out.loss)


def _vit(device, size=SMALL, dropout=0.0):
    """ViT image classification: patch embedding (a strided convolution), class token,
    position embeddings, pre-norm encoder layers with GELU, a linear head and its loss."""
    import transformers as T
    side = 16 if size is SMALL else 224
    cfg = T.ViTConfig(image_size=side, patch_size=4 if size is SMALL else 16, num_channels=3,
                      hidden_size=size.hidden, num_hidden_layers=size.layers,
                      num_attention_heads=size.heads, intermediate_size=4 * size.hidden,
                      num_labels=10,
                      **dropout_args(dropout, "hidden_dropout_prob",
                                     "attention_probs_dropout_prob"))
    model = hf_model("ViTForImageClassification", cfg).to(device).train()
    g = seeded_generator()
    x = torch.randn(size.batch, 3, side, side, generator=g).to(device)
    y = torch.randint(0, 10, (size.batch,), generator=g).to(device)
    return TrainCase("vit", model, {"pixel_values": x, "labels": y}, lambda out: out.loss)


def _resnet18(device, size=SMALL, dropout=0.0):
    import model_corpus as M
    torch.manual_seed(0)
    if M._torchvision_ok():
        import torchvision
        model = torchvision.models.resnet18(weights=None, num_classes=10)
    else:
        model = M.ResNet18(num_classes=10)
    model = model.to(device).train()
    side = 32 if size is SMALL else 224
    g = seeded_generator()
    x = torch.randn(size.batch, 3, side, side, generator=g).to(device)
    y = torch.randint(0, 10, (size.batch,), generator=g).to(device)
    return TrainCase("resnet18", model, {"x": x},
                     lambda out, y=y: torch.nn.functional.cross_entropy(out, y))


TRAIN_CASES = {"bert": _bert, "gpt2": _gpt2, "llama": _llama, "resnet18": _resnet18,
               "t5": _t5, "vit": _vit, **ZOO_CASES}


def step(case: TrainCase, model_fn, opt=None):
    """One training step: forward through `model_fn` (the model, or its compiled form), the
    loss, backward and (with an optimizer) its step. Returns the loss (detached)."""
    out = model_fn(**case.inputs)
    loss = case.loss(out)
    loss.backward()
    if opt is not None:
        opt.step()
    return loss.detach()


def steps_beside_eager(name: str, case: TrainCase, model_fn):
    """One SGD step (lr 0.05, momentum 0.9) of the case's model through `model_fn` (its compiled
    form), of a float32 copy run eagerly and of a float64 copy (the oracle): the runs, as
    [(model, fn, inputs)] in that order, and their losses."""
    m32, m64 = copy.deepcopy(case.model), copy.deepcopy(case.model).double()
    inputs64 = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
                for k, v in case.inputs.items()}
    runs = [(case.model, model_fn, case.inputs), (m32, m32, case.inputs), (m64, m64, inputs64)]
    losses = []
    for model, fn, inputs in runs:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        losses.append(step(TrainCase(name, model, inputs, case.loss), fn, opt))
    return runs, losses


def grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def params(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_as_close_as_eager(got, eager, oracle, name: str = "", factor: float = 4.0,
                             floor: float = 1e-6, rounded_to=None):
    """`got` (pyfuser, float32) is as close to `oracle` (eager in float64) as eager's own float32
    result is, within `factor`, or within `floor` times the oracle's largest magnitude: float
    tolerance measured, not guessed (a sum that cancels to ~0 has no meaningful relative error).
    Each element may also be one rounding of its dtype (`rounded_to`, else got's: a result
    compared in float32 after it was rounded to bfloat16) away, an ulp of the oracle's element:
    where eager's result lands on the rounded oracle exactly (its error 0), a sum rounded once
    from float32 may still be one ulp off (index fuzz seeds 5384, 5732, 6040: bfloat16)."""
    o = oracle.detach().double()
    err_eager = (eager.detach().double() - o).abs().max().item()
    diff = (got.detach().double() - o).abs()
    err_got = diff.max().item() if diff.numel() else 0.0
    scale = max(o.abs().max().item(), 1e-30)
    assert got.shape == eager.shape and got.dtype == eager.dtype, name
    dtype = rounded_to or got.dtype
    ulp = torch.finfo(dtype).eps * o.abs() if dtype.is_floating_point else 0
    allowed = factor * err_eager + floor * scale + ulp
    assert bool((diff <= allowed).all()), (
        f"{name}: pyfuser's error {err_got:.3g} vs eager's {err_eager:.3g} (oracle max {scale:.3g})")


def half_layer_norm_step(dtype, device, shape):
    """A LayerNorm whose parameters are half / bfloat16 (no autocast), through pyfuser.compile
    beside eager and float64 eager (the judge): forward, dx, dweight and dbias as close to
    float64 as eager's. Returns the compiled forward graph's region that holds the layer norm
    (its fusion's outputs: y and the saved mean and rstd)."""
    import pyfuser
    from pyfuser.frontend.fx import compiled_graphs
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(shape[-1]).to(device, dtype)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)
    ln64, ln_eager = copy.deepcopy(ln).double(), copy.deepcopy(ln)
    x = torch.randn(*shape, device=device, dtype=dtype)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_(), x.double().requires_grad_()]
    outs = [pyfuser.compile(ln)(xs[0]), ln_eager(xs[1]), ln64(xs[2])]
    assert_as_close_as_eager(*outs, "forward")
    for o in outs:
        (o.float() * o.detach().float().sin()).sum().backward()
    assert_as_close_as_eager(xs[0].grad, xs[1].grad, xs[2].grad, "dx")
    for name in ("weight", "bias"):
        assert_as_close_as_eager(getattr(ln, name).grad, getattr(ln_eager, name).grad,
                                 getattr(ln64, name).grad, name)
    (fw,) = [g for g in compiled_graphs() if g.kind == "forward"]
    return next(r for r in fw.regions if "aten.native_layer_norm.default" in r.ops)


def statistics_dtypes(region) -> list:
    """The dtypes of a layer norm region's outputs of size 1 along the last axis (mean, rstd)."""
    last = lambda o: o.logical[o.ndim - 1].extent  # noqa: E731
    return [o.dtype.torch for o in region.fusion.outputs
            if last(o).is_const and last(o).value == 1]
