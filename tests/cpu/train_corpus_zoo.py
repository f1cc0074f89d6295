"""The training corpus' wider zoo (train_corpus.TRAIN_CASES holds them beside BERT, GPT-2,
Llama, T5, ViT and ResNet-18): BLOOM, OPT, Falcon, GPT-NeoX, Mistral, Qwen2, Gemma and Phi
(causal LM), DistilBERT, DeBERTa-v2 and MobileBERT (masked LM), ELECTRA (discriminator), BART
(sequence to sequence), ConvNeXt and Swin (image classification), CLIP (contrastive), Wav2Vec2
and the Whisper encoder (audio classification). Each `build(device, size=SMALL, dropout=0.0)`
returns a TrainCase with random weights and seeded inputs; `ZOO_CASES` maps their names to them.
"""
from __future__ import annotations

import torch

from train_corpus_base import (SMALL, TrainCase, causal_lm, dropout_args, hf_model,
                               image_batch, padded_lm_case, padding_mask, seeded_generator,
                               token_batch)


def _bloom(device, size=SMALL, dropout=0.0):
    """BLOOM: ALiBi position biases (baddbmm into the scores), embedding layer norm, a padded
    sequence."""
    model, inputs = causal_lm("BloomForCausalLM", "BloomConfig", size, device, padded=True,
                               hidden_size=size.hidden, n_layer=size.layers, n_head=size.heads,
                               **dropout_args(dropout, "hidden_dropout", "attention_dropout"))
    return TrainCase("bloom", model, inputs, lambda out: out.loss)


def _opt(device, size=SMALL, dropout=0.0):
    """OPT: learned positions from the mask's cumsum, pre-norm ReLU blocks, a padded sequence."""
    model, inputs = causal_lm("OPTForCausalLM", "OPTConfig", size, device, padded=True,
                               hidden_size=size.hidden, ffn_dim=4 * size.hidden,
                               num_hidden_layers=size.layers, num_attention_heads=size.heads,
                               max_position_embeddings=max(64, size.seq),
                               word_embed_proj_dim=size.hidden,
                               **dropout_args(dropout, "dropout", "attention_dropout"))
    return TrainCase("opt", model, inputs, lambda out: out.loss)


def _falcon(device, size=SMALL, dropout=0.0):
    """Falcon: multi-query attention, rotary embeddings, parallel attention and MLP."""
    model, inputs = causal_lm("FalconForCausalLM", "FalconConfig", size, device,
                               hidden_size=size.hidden, num_hidden_layers=size.layers,
                               num_attention_heads=size.heads,
                               **dropout_args(dropout, "hidden_dropout", "attention_dropout"))
    return TrainCase("falcon", model, inputs, lambda out: out.loss)


def _gpt_neox(device, size=SMALL, dropout=0.0):
    """GPT-NeoX: rotary embeddings on a quarter of each head, parallel residual."""
    model, inputs = causal_lm("GPTNeoXForCausalLM", "GPTNeoXConfig", size, device,
                               hidden_size=size.hidden, intermediate_size=4 * size.hidden,
                               num_hidden_layers=size.layers, num_attention_heads=size.heads,
                               max_position_embeddings=max(64, size.seq), rotary_pct=0.25,
                               **dropout_args(dropout, "hidden_dropout", "attention_dropout"))
    return TrainCase("gpt_neox", model, inputs, lambda out: out.loss)


def _distilbert(device, size=SMALL, dropout=0.0):
    import transformers as T
    cfg = T.DistilBertConfig(vocab_size=size.vocab, dim=size.hidden, n_layers=size.layers,
                             n_heads=size.heads, hidden_dim=4 * size.hidden,
                             max_position_embeddings=max(64, size.seq),
                             **dropout_args(dropout, "dropout", "attention_dropout"))
    model = hf_model("DistilBertForMaskedLM", cfg).to(device).train()
    return padded_lm_case("distilbert", model, size, device)


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
                       **dropout_args(dropout, "dropout", "attention_dropout",
                                      "activation_dropout"))
    model = hf_model("BartForConditionalGeneration", cfg).to(device).train()
    return padded_lm_case("bart", model, size, device)


def _mistral(device, size=SMALL, dropout=0.0):
    """Mistral: grouped-query attention (one key / value head for two query heads), a sliding
    window (4 tokens) in the causal mask, a padded sequence."""
    model, inputs = causal_lm("MistralForCausalLM", "MistralConfig", size, device, padded=True,
                               hidden_size=size.hidden, intermediate_size=2 * size.hidden,
                               num_hidden_layers=size.layers, num_attention_heads=size.heads,
                               num_key_value_heads=max(1, size.heads // 2),
                               max_position_embeddings=max(64, size.seq),
                               sliding_window=max(2, size.seq // 2),
                               **dropout_args(dropout, "attention_dropout"))
    return TrainCase("mistral", model, inputs, lambda out: out.loss)


def _qwen2(device, size=SMALL, dropout=0.0):
    """Qwen2: grouped-query attention with biased query / key / value projections, tied
    embeddings."""
    model, inputs = causal_lm("Qwen2ForCausalLM", "Qwen2Config", size, device,
                               hidden_size=size.hidden, intermediate_size=2 * size.hidden,
                               num_hidden_layers=size.layers, num_attention_heads=size.heads,
                               num_key_value_heads=max(1, size.heads // 2),
                               max_position_embeddings=max(64, size.seq), tie_word_embeddings=True,
                               **dropout_args(dropout, "attention_dropout"))
    return TrainCase("qwen2", model, inputs, lambda out: out.loss)


def _gemma(device, size=SMALL, dropout=0.0):
    """Gemma: embeddings scaled by sqrt(hidden), RMSNorm with (1 + weight) computed in float,
    a GeGLU feed-forward (tanh GELU), head_dim wider than hidden / heads, multi-query
    attention."""
    model, inputs = causal_lm("GemmaForCausalLM", "GemmaConfig", size, device,
                               hidden_size=size.hidden, intermediate_size=2 * size.hidden,
                               num_hidden_layers=size.layers, num_attention_heads=size.heads,
                               num_key_value_heads=1, head_dim=2 * size.hidden // size.heads,
                               hidden_act="gelu_pytorch_tanh",
                               max_position_embeddings=max(64, size.seq),
                               **dropout_args(dropout, "attention_dropout"))
    return TrainCase("gemma", model, inputs, lambda out: out.loss)


def _phi(device, size=SMALL, dropout=0.0):
    """Phi: partial rotary embeddings (half of each head), a parallel attention and MLP block
    after one shared layer norm, gelu_new, biased LM head, query / key layer norms."""
    model, inputs = causal_lm("PhiForCausalLM", "PhiConfig", size, device, padded=True,
                               hidden_size=size.hidden, intermediate_size=4 * size.hidden,
                               num_hidden_layers=size.layers, num_attention_heads=size.heads,
                               max_position_embeddings=max(64, size.seq), qk_layernorm=True,
                               rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                "partial_rotary_factor": 0.5},
                               **dropout_args(dropout, "resid_pdrop", "embd_pdrop",
                                              "attention_dropout"))
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
                            **dropout_args(dropout, "hidden_dropout_prob",
                                           "attention_probs_dropout_prob"))
    model = hf_model("DebertaV2ForMaskedLM", cfg).to(device).train()
    return padded_lm_case("deberta_v2", model, size, device)


def _convnext(device, size=SMALL, dropout=0.0):
    """ConvNeXt: a patchify convolution, depthwise 7x7 convolutions, layer norms over channels
    both ways (permuted to channels-last for nn.LayerNorm, and a hand-written mean / variance
    over dim 1 at the downsampling), layer scale, a pooled linear head."""
    import transformers as T
    side = 32 if size is SMALL else 224
    w = size.hidden // 2
    cfg = T.ConvNextConfig(num_channels=3, patch_size=4, num_stages=2, hidden_sizes=[w, 2 * w],
                           depths=[1, 1], num_labels=10, image_size=side,
                           **dropout_args(dropout, "drop_path_rate"))
    model = hf_model("ConvNextForImageClassification", cfg).to(device).train()
    x, y = image_batch(size, device, side)
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
                       **dropout_args(dropout, "hidden_dropout_prob",
                                      "attention_probs_dropout_prob", "drop_path_rate"))
    model = hf_model("SwinForImageClassification", cfg).to(device).train()
    x, y = image_batch(size, device, side)
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
                  **dropout_args(dropout, "attention_dropout"))
    text = dict(vocab_size=size.vocab, max_position_embeddings=max(64, size.seq),
                pad_token_id=0, bos_token_id=1, eos_token_id=2, **common)
    vision = dict(image_size=side, patch_size=4, num_channels=3, **common)
    cfg = T.CLIPConfig(text_config=text, vision_config=vision, projection_dim=size.hidden)
    model = hf_model("CLIPModel", cfg).to(device).train()
    ids, _ = token_batch(size, device)
    ids[:, -1] = 2                                  # each sequence ends with its end token
    x, _ = image_batch(size, device, side)
    return TrainCase("clip", model, {"input_ids": ids, "attention_mask": padding_mask(ids, size),
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
                           **dropout_args(dropout, "hidden_dropout", "activation_dropout",
                                   "attention_dropout", "feat_proj_dropout", "final_dropout"),
                           layerdrop=0.0)
    model = hf_model("Wav2Vec2ForSequenceClassification", cfg).to(device).train()
    g = seeded_generator()
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
                          **dropout_args(dropout, "dropout", "attention_dropout",
                                         "activation_dropout"))
    model = hf_model("WhisperForAudioClassification", cfg).to(device).train()
    g = seeded_generator()
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
                             **dropout_args(dropout, "hidden_dropout_prob",
                                            "attention_probs_dropout_prob"))
    model = hf_model("MobileBertForMaskedLM", cfg).to(device).train()
    return padded_lm_case("mobilebert", model, size, device)


def _electra(device, size=SMALL, dropout=0.0):
    """ELECTRA discriminator: embeddings narrower than the hidden size (a projection), a BERT
    encoder, a per-token binary loss (BCE with logits over the unpadded tokens)."""
    import transformers as T
    cfg = T.ElectraConfig(vocab_size=size.vocab, embedding_size=size.hidden // 2,
                          hidden_size=size.hidden, num_hidden_layers=size.layers,
                          num_attention_heads=size.heads, intermediate_size=2 * size.hidden,
                          max_position_embeddings=max(64, size.seq),
                          **dropout_args(dropout, "hidden_dropout_prob",
                                         "attention_probs_dropout_prob"))
    model = hf_model("ElectraForPreTraining", cfg).to(device).train()
    ids, labels = token_batch(size, device)
    return TrainCase("electra", model, {"input_ids": ids,
                                        "attention_mask": padding_mask(ids, size),
                                        "labels": (labels % 7 == 0).long()},
                     lambda out: out.loss)


ZOO_CASES = {"bloom": _bloom, "opt": _opt, "falcon": _falcon, "gpt_neox": _gpt_neox,
             "distilbert": _distilbert, "bart": _bart, "mistral": _mistral, "qwen2": _qwen2,
             "gemma": _gemma, "phi": _phi, "deberta_v2": _deberta_v2, "convnext": _convnext,
             "swin": _swin, "clip": _clip, "wav2vec2": _wav2vec2, "whisper": _whisper,
             "mobilebert": _mobilebert, "electra": _electra}
