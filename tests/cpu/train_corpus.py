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
keeps the configs' own).

`step(case, model_fn, opt)` runs one training step (forward, loss, backward, optimizer step)
and returns the loss; `grads(model)` the gradients by parameter name.
`half_layer_norm_step` checks a half / bfloat16 LayerNorm's training step (no autocast).
Shared by tests/cpu/test_compile_training.py, tests/gpu/test_compile_gpu.py and bench/models.py.
"""
from __future__ import annotations

import copy
import logging
import warnings
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Size:
    batch: int
    seq: int            # tokens (HF models) or image side (ResNet)
    hidden: int
    layers: int
    heads: int
    vocab: int


SMALL = Size(batch=2, seq=8, hidden=32, layers=2, heads=2, vocab=64)
BENCH = Size(batch=8, seq=512, hidden=768, layers=4, heads=12, vocab=8192)


@dataclass
class TrainCase:
    name: str
    model: torch.nn.Module
    inputs: dict            # keyword arguments of model(...)
    loss: Callable          # model output -> scalar loss


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _tokens(size: Size, device):
    g = _gen()
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=g).to(device)
    labels = torch.randint(0, size.vocab, (size.batch, size.seq), generator=g).to(device)
    return ids, labels


def _hf_model(class_name: str, config):
    import transformers
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(transformers, class_name)(config)


def _drop(dropout, *names) -> dict:
    return {} if dropout is None else {n: dropout for n in names}


def _bert(device, size=SMALL, dropout=0.0):
    import transformers as T
    cfg = T.BertConfig(vocab_size=size.vocab, hidden_size=size.hidden,
                       num_hidden_layers=size.layers, num_attention_heads=size.heads,
                       intermediate_size=4 * size.hidden, max_position_embeddings=max(64, size.seq),
                       **_drop(dropout, "hidden_dropout_prob", "attention_probs_dropout_prob"))
    model = _hf_model("BertForMaskedLM", cfg).to(device).train()
    ids, labels = _tokens(size, device)
    mask = torch.ones_like(ids)
    mask[-1, size.seq - 2:] = 0                     # a padded sequence: the mask takes part
    return TrainCase("bert", model, {"input_ids": ids, "attention_mask": mask, "labels": labels},
                     lambda out: out.loss)


def _gpt2(device, size=SMALL, dropout=0.0):
    import transformers as T
    cfg = T.GPT2Config(vocab_size=size.vocab, n_embd=size.hidden, n_layer=size.layers,
                       n_head=size.heads, n_positions=max(64, size.seq), use_cache=False,
                       bos_token_id=0, eos_token_id=0,
                       **_drop(dropout, "resid_pdrop", "embd_pdrop", "attn_pdrop"))
    model = _hf_model("GPT2LMHeadModel", cfg).to(device).train()
    ids, labels = _tokens(size, device)
    return TrainCase("gpt2", model, {"input_ids": ids, "labels": labels}, lambda out: out.loss)


def _llama(device, size=SMALL, dropout=0.0):
    import transformers as T
    cfg = T.LlamaConfig(vocab_size=size.vocab, hidden_size=size.hidden,
                        intermediate_size=(8 * size.hidden) // 3 // 8 * 8,
                        num_hidden_layers=size.layers, num_attention_heads=size.heads,
                        num_key_value_heads=max(1, size.heads // 2),
                        max_position_embeddings=max(64, size.seq), use_cache=False,
                        bos_token_id=0, eos_token_id=0, pad_token_id=0,
                        **_drop(dropout, "attention_dropout"))
    model = _hf_model("LlamaForCausalLM", cfg).to(device).train()
    ids, labels = _tokens(size, device)
    return TrainCase("llama", model, {"input_ids": ids, "labels": labels}, lambda out: out.loss)


def _t5(device, size=SMALL, dropout=0.0):
    """T5 as a sequence-to-sequence LM: encoder, decoder with cross-attention, relative position
    buckets, RMS norms (no mean, no bias), a ReLU feed-forward, shifted decoder inputs."""
    import transformers as T
    cfg = T.T5Config(vocab_size=size.vocab, d_model=size.hidden, d_kv=size.hidden // size.heads,
                     d_ff=4 * size.hidden, num_layers=size.layers, num_heads=size.heads,
                     relative_attention_num_buckets=8, use_cache=False,
                     decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                     **_drop(dropout, "dropout_rate"))
    model = _hf_model("T5ForConditionalGeneration", cfg).to(device).train()
    ids, labels = _tokens(size, device)
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
                      **_drop(dropout, "hidden_dropout_prob", "attention_probs_dropout_prob"))
    model = _hf_model("ViTForImageClassification", cfg).to(device).train()
    g = _gen()
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
    g = _gen()
    x = torch.randn(size.batch, 3, side, side, generator=g).to(device)
    y = torch.randint(0, 10, (size.batch,), generator=g).to(device)
    return TrainCase("resnet18", model, {"x": x},
                     lambda out, y=y: torch.nn.functional.cross_entropy(out, y))


def _padded(ids, size):
    mask = torch.ones_like(ids)
    mask[-1, size.seq - 2:] = 0                     # a padded sequence: the mask takes part
    return mask


def _causal_lm(class_name, config_name, size, device, padded=False, **cfg):
    """A causal LM of `config_name` with the SMALL / BENCH widths; `padded`: an attention mask
    with a padded sequence."""
    import transformers as T
    cfg = getattr(T, config_name)(vocab_size=size.vocab, use_cache=False, bos_token_id=0,
                                  eos_token_id=0, pad_token_id=0, **cfg)
    model = _hf_model(class_name, cfg).to(device).train()
    ids, labels = _tokens(size, device)
    inputs = {"input_ids": ids, "labels": labels}
    if padded:
        inputs["attention_mask"] = _padded(ids, size)
    return model, inputs


def _bloom(device, size=SMALL, dropout=0.0):
    """BLOOM: ALiBi position biases (baddbmm into the scores), embedding layer norm, a padded
    sequence."""
    model, inputs = _causal_lm("BloomForCausalLM", "BloomConfig", size, device, padded=True,
                               hidden_size=size.hidden, n_layer=size.layers, n_head=size.heads,
                               **_drop(dropout, "hidden_dropout", "attention_dropout"))
    return TrainCase("bloom", model, inputs, lambda out: out.loss)


def _opt(device, size=SMALL, dropout=0.0):
    """OPT: learned positions from the mask's cumsum, pre-norm ReLU blocks, a padded sequence."""
    model, inputs = _causal_lm("OPTForCausalLM", "OPTConfig", size, device, padded=True,
                               hidden_size=size.hidden, ffn_dim=4 * size.hidden,
                               num_hidden_layers=size.layers, num_attention_heads=size.heads,
                               max_position_embeddings=max(64, size.seq),
                               word_embed_proj_dim=size.hidden,
                               **_drop(dropout, "dropout", "attention_dropout"))
    return TrainCase("opt", model, inputs, lambda out: out.loss)


def _falcon(device, size=SMALL, dropout=0.0):
    """Falcon: multi-query attention, rotary embeddings, parallel attention and MLP."""
    model, inputs = _causal_lm("FalconForCausalLM", "FalconConfig", size, device,
                               hidden_size=size.hidden, num_hidden_layers=size.layers,
                               num_attention_heads=size.heads,
                               **_drop(dropout, "hidden_dropout", "attention_dropout"))
    return TrainCase("falcon", model, inputs, lambda out: out.loss)


def _gpt_neox(device, size=SMALL, dropout=0.0):
    """GPT-NeoX: rotary embeddings on a quarter of each head, parallel residual."""
    model, inputs = _causal_lm("GPTNeoXForCausalLM", "GPTNeoXConfig", size, device,
                               hidden_size=size.hidden, intermediate_size=4 * size.hidden,
                               num_hidden_layers=size.layers, num_attention_heads=size.heads,
                               max_position_embeddings=max(64, size.seq), rotary_pct=0.25,
                               **_drop(dropout, "hidden_dropout", "attention_dropout"))
    return TrainCase("gpt_neox", model, inputs, lambda out: out.loss)


def _distilbert(device, size=SMALL, dropout=0.0):
    import transformers as T
    cfg = T.DistilBertConfig(vocab_size=size.vocab, dim=size.hidden, n_layers=size.layers,
                             n_heads=size.heads, hidden_dim=4 * size.hidden,
                             max_position_embeddings=max(64, size.seq),
                             **_drop(dropout, "dropout", "attention_dropout"))
    model = _hf_model("DistilBertForMaskedLM", cfg).to(device).train()
    ids, labels = _tokens(size, device)
    return TrainCase("distilbert", model, {"input_ids": ids, "attention_mask": _padded(ids, size),
                                           "labels": labels}, lambda out: out.loss)


def _bart(device, size=SMALL, dropout=0.0):
    """BART as a sequence-to-sequence LM: decoder inputs shifted from the labels (a slice
    scatter), learned positions, post-norm encoder and decoder with cross-attention."""
    import transformers as T
    cfg = T.BartConfig(vocab_size=size.vocab, d_model=size.hidden, encoder_layers=size.layers,
                       decoder_layers=size.layers, encoder_attention_heads=size.heads,
                       decoder_attention_heads=size.heads, encoder_ffn_dim=4 * size.hidden,
                       decoder_ffn_dim=4 * size.hidden, max_position_embeddings=max(64, size.seq),
                       use_cache=False, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                       decoder_start_token_id=0,
                       **_drop(dropout, "dropout", "attention_dropout", "activation_dropout"))
    model = _hf_model("BartForConditionalGeneration", cfg).to(device).train()
    ids, labels = _tokens(size, device)
    return TrainCase("bart", model, {"input_ids": ids, "attention_mask": _padded(ids, size),
                                     "labels": labels}, lambda out: out.loss)


def _mistral(device, size=SMALL, dropout=0.0):
    """Mistral: grouped-query attention (one key / value head for two query heads), a sliding
    window (4 tokens) in the causal mask, a padded sequence."""
    model, inputs = _causal_lm("MistralForCausalLM", "MistralConfig", size, device, padded=True,
                               hidden_size=size.hidden, intermediate_size=2 * size.hidden,
                               num_hidden_layers=size.layers, num_attention_heads=size.heads,
                               num_key_value_heads=max(1, size.heads // 2),
                               max_position_embeddings=max(64, size.seq),
                               sliding_window=max(2, size.seq // 2),
                               **_drop(dropout, "attention_dropout"))
    return TrainCase("mistral", model, inputs, lambda out: out.loss)


def _qwen2(device, size=SMALL, dropout=0.0):
    """Qwen2: grouped-query attention with biased query / key / value projections, tied
    embeddings."""
    model, inputs = _causal_lm("Qwen2ForCausalLM", "Qwen2Config", size, device,
                               hidden_size=size.hidden, intermediate_size=2 * size.hidden,
                               num_hidden_layers=size.layers, num_attention_heads=size.heads,
                               num_key_value_heads=max(1, size.heads // 2),
                               max_position_embeddings=max(64, size.seq), tie_word_embeddings=True,
                               **_drop(dropout, "attention_dropout"))
    return TrainCase("qwen2", model, inputs, lambda out: out.loss)


def _gemma(device, size=SMALL, dropout=0.0):
    """Gemma: embeddings scaled by sqrt(hidden), RMSNorm with (1 + weight) computed in float,
    a GeGLU feed-forward (tanh GELU), head_dim wider than hidden / heads, multi-query
    attention."""
    model, inputs = _causal_lm("GemmaForCausalLM", "GemmaConfig", size, device,
                               hidden_size=size.hidden, intermediate_size=2 * size.hidden,
                               num_hidden_layers=size.layers, num_attention_heads=size.heads,
                               num_key_value_heads=1, head_dim=2 * size.hidden // size.heads,
                               hidden_act="gelu_pytorch_tanh",
                               max_position_embeddings=max(64, size.seq),
                               **_drop(dropout, "attention_dropout"))
    return TrainCase("gemma", model, inputs, lambda out: out.loss)


def _phi(device, size=SMALL, dropout=0.0):
    """Phi: partial rotary embeddings (half of each head), a parallel attention and MLP block
    after one shared layer norm, gelu_new, biased LM head, query / key layer norms."""
    model, inputs = _causal_lm("PhiForCausalLM", "PhiConfig", size, device, padded=True,
                               hidden_size=size.hidden, intermediate_size=4 * size.hidden,
                               num_hidden_layers=size.layers, num_attention_heads=size.heads,
                               max_position_embeddings=max(64, size.seq), qk_layernorm=True,
                               rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                "partial_rotary_factor": 0.5},
                               **_drop(dropout, "resid_pdrop", "embd_pdrop", "attention_dropout"))
    return TrainCase("phi", model, inputs, lambda out: out.loss)


def _deberta_v2(device, size=SMALL, dropout=0.0):
    """DeBERTa-v2: disentangled attention (content-to-position and position-to-content scores
    gathered by relative-position buckets), a padded sequence, masked LM."""
    import transformers as T
    cfg = T.DebertaV2Config(vocab_size=size.vocab, hidden_size=size.hidden,
                            num_hidden_layers=size.layers, num_attention_heads=size.heads,
                            intermediate_size=2 * size.hidden,
                            max_position_embeddings=max(64, size.seq), relative_attention=True,
                            position_buckets=8, max_relative_positions=16,
                            pos_att_type=["p2c", "c2p"],
                            **_drop(dropout, "hidden_dropout_prob",
                                    "attention_probs_dropout_prob"))
    model = _hf_model("DebertaV2ForMaskedLM", cfg).to(device).train()
    ids, labels = _tokens(size, device)
    return TrainCase("deberta_v2", model, {"input_ids": ids, "attention_mask": _padded(ids, size),
                                           "labels": labels}, lambda out: out.loss)


def _images(size, device, side, classes=10):
    g = _gen()
    x = torch.randn(size.batch, 3, side, side, generator=g).to(device)
    y = torch.randint(0, classes, (size.batch,), generator=g).to(device)
    return x, y


def _convnext(device, size=SMALL, dropout=0.0):
    """ConvNeXt: a patchify convolution, depthwise 7x7 convolutions, layer norms over channels
    both ways (permuted to channels-last for nn.LayerNorm, and a hand-written mean / variance
    over dim 1 at the downsampling), layer scale, a pooled linear head."""
    import transformers as T
    side = 32 if size is SMALL else 224
    w = size.hidden // 2
    cfg = T.ConvNextConfig(num_channels=3, patch_size=4, num_stages=2, hidden_sizes=[w, 2 * w],
                           depths=[1, 1], num_labels=10, image_size=side,
                           **_drop(dropout, "drop_path_rate"))
    model = _hf_model("ConvNextForImageClassification", cfg).to(device).train()
    x, y = _images(size, device, side)
    return TrainCase("convnext", model, {"pixel_values": x, "labels": y}, lambda out: out.loss)


def _swin(device, size=SMALL, dropout=0.0):
    """Swin: windowed attention with a relative position bias table, a shifted block
    (torch.roll and the shifted windows' mask), padding of an 8x8 grid (4x4 after the patch
    merging: strided slices and a concatenation) to windows of 3."""
    import transformers as T
    side = 16 if size is SMALL else 224
    cfg = T.SwinConfig(image_size=side, patch_size=2, num_channels=3, embed_dim=size.hidden // 2,
                       depths=[2, 1], num_heads=[size.heads, size.heads], window_size=3,
                       mlp_ratio=2.0, num_labels=10,
                       **_drop(dropout, "hidden_dropout_prob", "attention_probs_dropout_prob",
                               "drop_path_rate"))
    model = _hf_model("SwinForImageClassification", cfg).to(device).train()
    x, y = _images(size, device, side)
    return TrainCase("swin", model, {"pixel_values": x, "labels": y}, lambda out: out.loss)


def _clip(device, size=SMALL, dropout=0.0):
    """CLIP: a text tower (causal mask, quick GELU, pooling at each sequence's end token, an
    argmax gather) and a vision tower (patch embedding, class token, pre-layer norm), projected,
    normalized and compared by the contrastive loss (a learned temperature, two cross
    entropies over the batch)."""
    import transformers as T
    side = 16 if size is SMALL else 224
    common = dict(hidden_size=size.hidden, intermediate_size=2 * size.hidden,
                  num_hidden_layers=size.layers, num_attention_heads=size.heads,
                  **_drop(dropout, "attention_dropout"))
    text = dict(vocab_size=size.vocab, max_position_embeddings=max(64, size.seq),
                pad_token_id=0, bos_token_id=1, eos_token_id=2, **common)
    vision = dict(image_size=side, patch_size=4, num_channels=3, **common)
    cfg = T.CLIPConfig(text_config=text, vision_config=vision, projection_dim=size.hidden)
    model = _hf_model("CLIPModel", cfg).to(device).train()
    ids, _ = _tokens(size, device)
    ids[:, -1] = 2                                  # each sequence ends with its end token
    x, _ = _images(size, device, side)
    return TrainCase("clip", model, {"input_ids": ids, "attention_mask": _padded(ids, size),
                                     "pixel_values": x, "return_loss": True},
                     lambda out: out.loss)


def _wav2vec2(device, size=SMALL, dropout=0.0):
    """Wav2Vec2 audio classification: a strided conv1d feature extractor with a group norm
    (one group per channel), a feature projection with layer norm, a grouped convolutional
    position embedding (weight norm), post-norm encoder layers, mean pooling."""
    import transformers as T
    cfg = T.Wav2Vec2Config(hidden_size=size.hidden, num_hidden_layers=size.layers,
                           num_attention_heads=size.heads, intermediate_size=2 * size.hidden,
                           conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                           feat_extract_norm="group", num_conv_pos_embeddings=8,
                           num_conv_pos_embedding_groups=2, apply_spec_augment=False,
                           mask_time_prob=0.0, num_labels=4, classifier_proj_size=size.hidden,
                           **_drop(dropout, "hidden_dropout", "activation_dropout",
                                   "attention_dropout", "feat_proj_dropout", "final_dropout"),
                           layerdrop=0.0)
    model = _hf_model("Wav2Vec2ForSequenceClassification", cfg).to(device).train()
    g = _gen()
    audio = torch.randn(size.batch, 20 * size.seq + 10, generator=g).to(device)
    y = torch.randint(0, 4, (size.batch,), generator=g).to(device)
    return TrainCase("wav2vec2", model, {"input_values": audio, "labels": y},
                     lambda out: out.loss)


def _whisper(device, size=SMALL, dropout=0.0):
    """Whisper encoder, as audio classification: two conv1d with GELU (the second strided),
    sinusoidal positions, pre-norm encoder layers, a mean-pooled projection and its loss."""
    import transformers as T
    cfg = T.WhisperConfig(num_mel_bins=8, d_model=size.hidden, encoder_layers=size.layers,
                          encoder_attention_heads=size.heads, encoder_ffn_dim=2 * size.hidden,
                          decoder_layers=1, decoder_attention_heads=size.heads,
                          decoder_ffn_dim=2 * size.hidden, max_source_positions=size.seq,
                          vocab_size=size.vocab, num_labels=4, classifier_proj_size=size.hidden,
                          apply_spec_augment=False, mask_time_prob=0.0, pad_token_id=0,
                          bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                          **_drop(dropout, "dropout", "attention_dropout", "activation_dropout"))
    model = _hf_model("WhisperForAudioClassification", cfg).to(device).train()
    g = _gen()
    feats = torch.randn(size.batch, 8, 2 * size.seq, generator=g).to(device)
    y = torch.randint(0, 4, (size.batch,), generator=g).to(device)
    return TrainCase("whisper", model, {"input_features": feats, "labels": y},
                     lambda out: out.loss)


def _mobilebert(device, size=SMALL, dropout=0.0):
    """MobileBERT: trigram input embeddings (shifted concatenation), bottlenecks, NoNorm (an
    elementwise scale and shift), stacked feed-forward networks, masked LM whose decoder
    concatenates a dense weight to the embeddings'."""
    import transformers as T
    cfg = T.MobileBertConfig(vocab_size=size.vocab, hidden_size=size.hidden,
                             num_hidden_layers=size.layers, num_attention_heads=size.heads,
                             intermediate_size=size.hidden, embedding_size=size.hidden // 2,
                             intra_bottleneck_size=size.hidden // 2,
                             max_position_embeddings=max(64, size.seq),
                             num_feedforward_networks=2,
                             **_drop(dropout, "hidden_dropout_prob",
                                     "attention_probs_dropout_prob"))
    model = _hf_model("MobileBertForMaskedLM", cfg).to(device).train()
    ids, labels = _tokens(size, device)
    return TrainCase("mobilebert", model, {"input_ids": ids, "attention_mask": _padded(ids, size),
                                           "labels": labels}, lambda out: out.loss)


def _electra(device, size=SMALL, dropout=0.0):
    """ELECTRA discriminator: embeddings narrower than the hidden size (a projection), a BERT
    encoder, a per-token binary loss (BCE with logits over the unpadded tokens)."""
    import transformers as T
    cfg = T.ElectraConfig(vocab_size=size.vocab, embedding_size=size.hidden // 2,
                          hidden_size=size.hidden, num_hidden_layers=size.layers,
                          num_attention_heads=size.heads, intermediate_size=2 * size.hidden,
                          max_position_embeddings=max(64, size.seq),
                          **_drop(dropout, "hidden_dropout_prob", "attention_probs_dropout_prob"))
    model = _hf_model("ElectraForPreTraining", cfg).to(device).train()
    ids, labels = _tokens(size, device)
    return TrainCase("electra", model, {"input_ids": ids, "attention_mask": _padded(ids, size),
                                        "labels": (labels % 7 == 0).long()},
                     lambda out: out.loss)


TRAIN_CASES = {"bert": _bert, "gpt2": _gpt2, "llama": _llama, "resnet18": _resnet18,
               "t5": _t5, "vit": _vit, "bloom": _bloom, "opt": _opt, "falcon": _falcon,
               "gpt_neox": _gpt_neox, "distilbert": _distilbert, "bart": _bart,
               "mistral": _mistral, "qwen2": _qwen2, "gemma": _gemma, "phi": _phi,
               "deberta_v2": _deberta_v2, "convnext": _convnext, "swin": _swin, "clip": _clip,
               "wav2vec2": _wav2vec2, "whisper": _whisper, "mobilebert": _mobilebert,
               "electra": _electra}


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
                             floor: float = 1e-6):
    """`got` (pyfuser, float32) is as close to `oracle` (eager in float64) as eager's own float32
    result is, within `factor`, or within `floor` times the oracle's largest magnitude: float
    tolerance measured, not guessed (a sum that cancels to ~0 has no meaningful relative error)."""
    o = oracle.detach().double()
    err_eager = (eager.detach().double() - o).abs().max().item()
    err_got = (got.detach().double() - o).abs().max().item()
    scale = max(o.abs().max().item(), 1e-30)
    assert got.shape == eager.shape and got.dtype == eager.dtype, name
    assert err_got <= factor * err_eager + floor * scale, (
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
