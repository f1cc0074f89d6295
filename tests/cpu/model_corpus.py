"""Small real models for the fuser: HF transformers BERT, GPT-2, Llama, T5 (encoder), ViT,
Falcon (multi-query attention, rotary, parallel blocks), DistilBERT and a ResNet-18 (eval and
train), with random weights (never a download) and seeded inputs.

`CASES` lists `ModelCase(name, build, how, needs)`: `build(device, scale=1)` returns (model,
example inputs) with the model in the mode the case is about (`scale` multiplies widths and the
sequence length or image size, for the GPU benchmark); `how` is "trace" or "script" (HF models
do not script: TorchScript cannot read their config classes' source); `needs` names the
package the case cannot run without (`available(case)` says whether it is installed).

ResNet-18 is torchvision's when torchvision imports; otherwise the same network written here
(`ResNet18`: the stem, four stages of two basic blocks of 64-128-256-512 channels, average pool,
linear head), so the corpus keeps a ResNet where torchvision cannot be installed (PyPI's
torchvision does not import beside the CPU build of torch 2.13). `resnet_source()` says which.
Shared by tests/cpu/test_models.py and bench/models_jit.py.
"""
from __future__ import annotations

import importlib.util
import logging
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

BATCH, SEQ, VOCAB = 2, 8, 99


@dataclass(frozen=True)
class ModelCase:
    name: str
    build: Callable
    how: str
    needs: str = ""


def available(case: ModelCase) -> bool:
    return not case.needs or importlib.util.find_spec(case.needs) is not None


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ids(device, scale: int = 1, masked: bool = False):
    seq = SEQ * scale
    ids = torch.randint(0, VOCAB, (BATCH, seq), generator=_gen()).to(device)
    if not masked:
        return (ids,)
    mask = torch.ones(BATCH, seq, dtype=torch.long)
    mask[1, seq - 2:] = 0                 # a padded sequence: the mask takes part
    return ids, mask.to(device)


def _hf(make_config, model_class: str, inputs):
    def build(device="cpu", scale: int = 1):
        import transformers
        logging.getLogger("transformers").setLevel(logging.ERROR)
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = getattr(transformers, model_class)(make_config(transformers, scale))
        return model.eval().to(device), inputs(device, scale)
    return build


def _bert(T, k):
    return T.BertConfig(vocab_size=VOCAB, hidden_size=32 * k, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64 * k,
                        max_position_embeddings=32 * k, return_dict=False)


def _gpt2(T, k):
    return T.GPT2Config(vocab_size=VOCAB, n_embd=32 * k, n_layer=2, n_head=2,
                        n_positions=32 * k, use_cache=False, return_dict=False, bos_token_id=0,
                        eos_token_id=0)


def _llama(T, k):
    return T.LlamaConfig(vocab_size=VOCAB, hidden_size=32 * k, intermediate_size=64 * k,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=32 * k, use_cache=False, return_dict=False,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)


def _t5(T, k):
    return T.T5Config(vocab_size=VOCAB, d_model=32 * k, d_kv=8 * k, d_ff=64 * k, num_layers=2,
                      num_heads=4, relative_attention_num_buckets=8, use_cache=False,
                      return_dict=False, decoder_start_token_id=0, pad_token_id=0,
                      eos_token_id=1)


def _vit(T, k):
    return T.ViTConfig(image_size=16 * k, patch_size=4, num_channels=3, hidden_size=32 * k,
                       num_hidden_layers=2, num_attention_heads=2, intermediate_size=64 * k,
                       return_dict=False)


def _falcon(T, k):
    return T.FalconConfig(vocab_size=VOCAB, hidden_size=32 * k, num_hidden_layers=2,
                          num_attention_heads=2, use_cache=False, return_dict=False,
                          bos_token_id=0, eos_token_id=0, pad_token_id=0)


def _distilbert(T, k):
    return T.DistilBertConfig(vocab_size=VOCAB, dim=32 * k, n_layers=2, n_heads=2,
                              hidden_dim=64 * k, max_position_embeddings=32 * k,
                              return_dict=False)


def _image(size: int):
    return lambda device, scale=1: (
        torch.randn(BATCH, 3, size * scale, size * scale, generator=_gen()).to(device),)


# ----- ResNet-18 ------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = nn.Sequential()
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.downsample(x)
        return self.relu(out)


class ResNet18(nn.Module):
    """ResNet-18 as torchvision builds it (without torchvision)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _torchvision_ok() -> bool:
    try:
        import torchvision.models  # noqa: F401
        return True
    except Exception:          # noqa: BLE001 - missing, or built for another torch
        return False


def resnet_source() -> str:
    return "torchvision" if _torchvision_ok() else "model_corpus.ResNet18 (torchvision missing)"


def _resnet(train: bool):
    def build(device="cpu", scale: int = 1):
        torch.manual_seed(0)
        if _torchvision_ok():
            import torchvision
            model = torchvision.models.resnet18(weights=None, num_classes=10)
        else:
            model = ResNet18(num_classes=10)
        model.train(train)
        return model.to(device), _image(32)(device, scale)
    return build


CASES = [
    ModelCase("bert", _hf(_bert, "BertModel", lambda d, k=1: _ids(d, k, masked=True)), "trace",
              "transformers"),
    ModelCase("gpt2", _hf(_gpt2, "GPT2Model", _ids), "trace", "transformers"),
    ModelCase("llama", _hf(_llama, "LlamaModel", _ids), "trace", "transformers"),
    ModelCase("t5_encoder", _hf(_t5, "T5EncoderModel", _ids), "trace", "transformers"),
    ModelCase("vit", _hf(_vit, "ViTModel", _image(16)), "trace", "transformers"),
    ModelCase("falcon", _hf(_falcon, "FalconModel", _ids), "trace", "transformers"),
    ModelCase("distilbert", _hf(_distilbert, "DistilBertModel",
                                lambda d, k=1: _ids(d, k, masked=True)), "trace", "transformers"),
    ModelCase("resnet18_eval", _resnet(False), "trace"),
    ModelCase("resnet18_eval", _resnet(False), "script"),
    ModelCase("resnet18_train", _resnet(True), "trace"),
    ModelCase("resnet18_train", _resnet(True), "script"),
]


def compile_case(case: ModelCase, model, inputs):
    """The torch.jit object of a case (traced under no_grad: the trace records no autograd)."""
    if case.how == "script":
        return torch.jit.script(model)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        return torch.jit.trace(model, inputs, strict=False, check_trace=False)


def tensors(x) -> list:
    """The tensors of a (nested) model output, in order."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in tensors(e)]
    if isinstance(x, dict):
        return [t for k in x for t in tensors(x[k])]
    return []


def as_close_as_eager(got, want, exact, what):
    """`got` (pyfuser) equals `want` (eager) within rtol 1e-4, or is at most 4x as far as eager
    from `exact` (the model run in float64): train-mode batch norm over few values a channel is
    ill-conditioned, so summation orders drift apart there."""
    try:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=what)
        return
    except AssertionError:
        if not got.is_floating_point():
            raise
    err = (got.double() - exact).abs().max().item()
    eager_err = (want.double() - exact).abs().max().item()
    assert err <= 4 * eager_err + 1e-5, \
        f"{what}: pyfuser is {err:.3g} from the float64 result, eager {eager_err:.3g}"
