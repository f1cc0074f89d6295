"""Text forms of constant values in attributes: floats, strings, complex numbers, tensors.

`format_*` produce what PyTorch prints (floats with 17 significant digits and a trailing `.`
when they look integral, `inf`/`-inf`/`nan`; strings C-escaped with `\\ooo` octal for other
bytes; tensors as `{v}` when they hold one element, ` v0  v1 [ CPUFloatType{2} ]` up to 10,
`<Tensor>` beyond). `parse_*` invert them; they raise ValueError with a short reason, which
the parser turns into IRParseError at the right position. Our tensor text prints each element
exactly (17 digits), so print -> parse is lossless up to 10 elements.
"""
from __future__ import annotations

import math
import re

import torch

from .types import DTYPE_TO_NAME, NAME_TO_DTYPE

MAX_TENSOR_DISPLAY = 10

_ESCAPES = {"\\": "\\\\", '"': '\\"', "'": "\\'", "\a": "\\a", "\b": "\\b", "\f": "\\f",
            "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
# Three "digits" of PyTorch's octal escape of a negative (signed) char, at least one below '0'.
_SIGNED_OCTAL = re.compile(r"(?=[./01][(-7]{2})(?=.?.?[(-/])[./01][(-7][(-7]")
_UNESCAPES = {"\\": 0x5C, '"': 0x22, "'": 0x27, "a": 7, "b": 8, "f": 12, "n": 10, "r": 13,
              "t": 9, "v": 11, "?": 0x3F}


def format_float(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    s = "%.17g" % v
    if not any(c in s for c in ".e"):
        s += "."
    return s


def format_complex(v: complex) -> str:
    imag = format_float(v.imag)
    sign = "" if imag.startswith("-") else "+"
    return f"{format_float(v.real)}{sign}{imag}j"


def format_string(s: str) -> str:
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.extend("\\%03o" % b for b in ch.encode("utf-8"))
    return '"' + "".join(out) + '"'


def unescape_string(body: str) -> str:
    """The text between the quotes of a printed string, escapes decoded. Raises ValueError."""
    out = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out += ch.encode("utf-8")
            i += 1
            continue
        if i + 1 >= len(body):
            raise ValueError("string ends with a lone backslash")
        nxt = body[i + 1]
        signed = _SIGNED_OCTAL.match(body, i + 1)
        if signed:
            # PyTorch prints a byte >= 0x80 as three "digits" '0' + d of the *signed* char
            # (C division, so d may be negative: 0xC3 is `\\0)+`); the digits recombine exactly.
            d = [ord(ch) - ord("0") for ch in signed.group(0)]
            out.append((d[0] * 64 + d[1] * 8 + d[2]) & 0xFF)
            i += 4
        elif nxt in _UNESCAPES:
            out.append(_UNESCAPES[nxt])
            i += 2
        elif nxt in "01234567":
            m = re.match(r"[0-7]{1,3}", body[i + 1:])
            out.append(int(m.group(0), 8) & 0xFF)
            i += 1 + len(m.group(0))
        elif nxt == "x":
            m = re.match(r"[0-9a-fA-F]{1,2}", body[i + 2:])
            if not m:
                raise ValueError("\\x escape without hex digits")
            out.append(int(m.group(0), 16))
            i += 2 + len(m.group(0))
        else:
            raise ValueError(f"unknown escape \\{nxt}")
    return out.decode("utf-8", errors="replace")


def _format_scalar(v) -> str:
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, complex):
        return format_complex(v)
    return format_float(v)


def format_tensor(t) -> str:
    if t is None:
        return "<Tensor>"
    if t.numel() == 1:
        return "{" + _format_scalar(t.reshape(()).item()) + "}"
    if t.numel() > MAX_TENSOR_DISPLAY or t.dtype not in DTYPE_TO_NAME:
        return "<Tensor>"
    backend = "CUDA" if t.device.type == "cuda" else "CPU"
    vals = "".join(" " + _format_scalar(x) for x in t.detach().cpu().reshape(-1).tolist())
    dims = ",".join(str(d) for d in t.shape)
    return f"{vals} [ {backend}{DTYPE_TO_NAME[t.dtype]}Type{{{dims}}} ]"


# ` 1  2  3 [ CPUFloatType{3} ]` -- the trailer that ends a multi-element tensor literal.
TENSOR_TRAILER = re.compile(r"\[\s*([A-Za-z0-9_]+)Type\{([0-9,\s]*)\}\s*\]")
_BACKENDS = ("CUDA", "CPU", "Meta", "MPS", "XPU", "HIP", "")
_NUM = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|inf|nan)"
_COMPLEX = re.compile(rf"({_NUM})([-+](?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan))j\Z")


def _scalar_from_text(tok: str):
    m = _COMPLEX.match(tok)
    if m:
        return complex(float(m.group(1)), float(m.group(2)))
    if re.fullmatch(r"[-+]?\d+", tok):
        return int(tok)
    if tok in ("True", "False"):
        return tok == "True"
    return float(tok)


def parse_tensor_literal(body: str, type_name: str, dims: str) -> torch.Tensor:
    """Rebuild a tensor from `body` (the values) and its `[ CPUFloatType{2,2} ]` trailer."""
    dtype = next((NAME_TO_DTYPE[type_name[len(b):]] for b in _BACKENDS
                  if type_name.startswith(b) and type_name[len(b):] in NAME_TO_DTYPE), None)
    if dtype is None:
        raise ValueError(f"unknown tensor type {type_name}Type in tensor literal")
    shape = [int(d) for d in dims.replace(" ", "").split(",") if d] if dims.strip() else []
    body = re.sub(r"\(\s*\d+\s*(,\s*\.\s*)+\)\s*=", " ", body)      # `(1,.,.) =` slices
    body = re.sub(r"Columns\s+\d+\s+to\s+\d+", " ", body)
    scale = 1.0
    m = re.match(rf"\s*({_NUM})\s*\*", body)
    if m:
        scale = float(m.group(1))
        body = body[m.end():]
    try:
        vals = [_scalar_from_text(tok) for tok in body.split()]
    except ValueError:
        raise ValueError("bad number in tensor literal") from None
    numel = math.prod(shape)
    if len(vals) != numel:
        raise ValueError(f"tensor literal has {len(vals)} values but its type says {numel}")
    if scale != 1.0:
        vals = [v * scale for v in vals]
    if dtype.is_complex:
        t = torch.tensor([complex(v) for v in vals], dtype=dtype)
    elif dtype == torch.bool:
        t = torch.tensor([bool(v) for v in vals], dtype=dtype)
    else:
        t = torch.tensor(vals, dtype=torch.float64 if dtype.is_floating_point else torch.int64)
        t = t.to(dtype)
    return t.reshape(shape)


def scalar_tensor(v) -> torch.Tensor:
    """The tensor for a `{v}` literal (dtype refined later from the value's declared type)."""
    if isinstance(v, bool):
        return torch.tensor(v)
    if isinstance(v, int):
        return torch.tensor(v, dtype=torch.int64)
    if isinstance(v, complex):
        return torch.tensor(v, dtype=torch.complex128)
    return torch.tensor(v, dtype=torch.float64)
