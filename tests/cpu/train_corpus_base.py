"""What the training corpus' models share (tests/cpu/train_corpus.py, train_corpus_zoo.py): the
sizes (SMALL for the CPU tests, BENCH for bench/models.py), the TrainCase a builder returns,
seeded token and image batches, an HF model built from a config with random weights (never a
download), a padded sequence's attention mask, a padded language model's TrainCase and a
causal LM of any HF config.
"""
from __future__ import annotations

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


def seeded_generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def token_batch(size: Size, device):
    g = seeded_generator()
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=g).to(device)
    labels = torch.randint(0, size.vocab, (size.batch, size.seq), generator=g).to(device)
    return ids, labels


def hf_model(class_name: str, config):
    import transformers
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(transformers, class_name)(config)


def dropout_args(dropout, *names) -> dict:
    return {} if dropout is None else {n: dropout for n in names}


def padding_mask(ids, size):
    mask = torch.ones_like(ids)
    mask[-1, size.seq - 2:] = 0                     # a padded sequence: the mask takes part
    return mask


def padded_lm_case(name: str, model, size: Size, device) -> TrainCase:
    """A language model's TrainCase on seeded tokens and labels, with a padded sequence's
    attention mask, and the model's own loss (the masked LMs, BART)."""
    ids, labels = token_batch(size, device)
    return TrainCase(name, model, {"input_ids": ids, "attention_mask": padding_mask(ids, size),
                                   "labels": labels}, lambda out: out.loss)


def causal_lm(class_name, config_name, size, device, padded=False, **cfg):
    """A causal LM of `config_name` with the SMALL / BENCH widths; `padded`: an attention mask
    with a padded sequence."""
    import transformers as T
    cfg = getattr(T, config_name)(vocab_size=size.vocab, use_cache=False, bos_token_id=0,
                                  eos_token_id=0, pad_token_id=0, **cfg)
    model = hf_model(class_name, cfg).to(device).train()
    ids, labels = token_batch(size, device)
    inputs = {"input_ids": ids, "labels": labels}
    if padded:
        inputs["attention_mask"] = padding_mask(ids, size)
    return model, inputs


def image_batch(size, device, side, classes=10):
    g = seeded_generator()
    x = torch.randn(size.batch, 3, side, side, generator=g).to(device)
    y = torch.randint(0, classes, (size.batch,), generator=g).to(device)
    return x, y
