"""Parsing of the two sub-languages inside IR statements: types and attribute values.

`parse_type(sc)` accepts every form PyTorch prints (see types.py) plus the Python spellings
`Optional[T]`, `List[T]`, `Tuple[...]`, `Dict[K, V]`, `Union[...]`. Unknown bare words are
errors; dotted names (`__torch__.M`) are class types.
`parse_attr_value(sc)` returns (kind, value) with kinds as in node.ATTR_KINDS. Tensor literals
(`{5}`, ` 1  2 [ CPULongType{2} ]`, `<Tensor>`) become CPU tensors (None for `<Tensor>`).
Both raise IRParseError via the scanner, never anything else.
"""
from __future__ import annotations

import re

from .lexer import DOTTED, IDENT, INT, MAX_NESTING, NUMBER, Scanner
from .literals import TENSOR_TRAILER, parse_tensor_literal, scalar_tensor, unescape_string
from .types import (NAME_TO_DTYPE, SIMPLE_TYPES, ClassType, ContainerType, DictType, EnumType,
                    JitType, ListType, OptionalType, TensorType, TupleType, UnionType)

_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_DEVICE = re.compile(r"[A-Za-z_]+(?::\d+)?")
_SLICE_HEADER = re.compile(r"\(\s*\d+\s*,\s*\.")
_COMPLEX_TAIL = re.compile(r"([-+](?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan))j")


def parse_type(sc: Scanner) -> JitType:
    sc.nest("type")
    try:
        return _postfix(sc, _parse_base_type(sc))
    finally:
        sc.depth -= 1


def _postfix(sc: Scanner, t: JitType) -> JitType:
    wraps = 0
    while True:
        if sc.depth + wraps > MAX_NESTING:
            raise sc.error(f"type nested more than {MAX_NESTING} levels deep")
        wraps += 1
        if sc.peek("[Undefined]") and isinstance(t, TensorType):
            sc.pos += len("[Undefined]")
            t = TensorType(t.dtype, t.sizes, t.strides, t.device, t.requires_grad, True)
        elif sc.peek("[]"):
            sc.pos += 2
            t = ListType(t)
        elif sc.peek("["):
            # `T [ ]` with spaces
            save = sc.pos
            sc.pos += 1
            if sc.accept("]"):
                t = ListType(t)
            else:
                sc.pos = save
                return t
        elif sc.accept("?"):
            t = OptionalType(t)
        else:
            return t


def _type_list(sc: Scanner, close: str) -> list:
    items = []
    if sc.accept(close):
        return items
    while True:
        items.append(parse_type(sc))
        if sc.accept(close):
            return items
        sc.expect(",", f"or `{close}` in type list")


def _parse_base_type(sc: Scanner) -> JitType:
    if sc.accept("("):
        return TupleType(tuple(_type_list(sc, ")")))
    start = sc.pos
    m = sc.match(DOTTED)
    if not m:
        raise sc.error(f"expected a type, found {sc.found()}")
    word = m.group(0)
    if "." in word:
        return ClassType(word)
    if word == "Tensor" or word in NAME_TO_DTYPE:
        return _tensor_type(sc, NAME_TO_DTYPE.get(word), has_rank_form=word != "Tensor")
    if word.endswith("Tensor") and word[:-6] in NAME_TO_DTYPE:
        return _tensor_type(sc, NAME_TO_DTYPE[word[:-6]], has_rank_form=False)
    if word in ("Optional", "List") and sc.accept("["):
        (elem,) = _exactly(sc, _type_list(sc, "]"), 1, start)
        return OptionalType(elem) if word == "Optional" else ListType(elem)
    if word == "Tuple" and sc.accept("["):
        return TupleType(tuple(_type_list(sc, "]")))
    if word == "Dict" and (sc.peek("(") or sc.peek("[")):
        close = ")" if sc.accept("(") else (sc.accept("[") and "]")
        k, v = _exactly(sc, _type_list(sc, close), 2, start)
        return DictType(k, v)
    if word == "Union" and (sc.peek("(") or sc.peek("[")):
        close = ")" if sc.accept("(") else (sc.accept("[") and "]")
        return UnionType(tuple(_type_list(sc, close)))
    if word in ("Future", "RRef", "Await") and (sc.peek("(") or sc.peek("[")):
        close = ")" if sc.accept("(") else (sc.accept("[") and "]")
        (elem,) = _exactly(sc, _type_list(sc, close), 1, start)
        return ContainerType(word, elem)
    if word == "NamedTuple" and sc.accept("("):
        return _named_tuple(sc)
    if word == "Enum" and sc.accept("<"):
        name = sc.expect_match(DOTTED, "an enum class name").group(0)
        sc.expect(">", "to close `Enum<`")
        return EnumType(name)
    if word in SIMPLE_TYPES:
        return SIMPLE_TYPES[word]
    raise sc.error(f"unknown type `{word}`", start)


def _exactly(sc: Scanner, items: list, n: int, pos: int) -> list:
    if len(items) != n:
        raise sc.error(f"expected {n} type argument(s), found {len(items)}", pos)
    return items


def _named_tuple(sc: Scanner) -> TupleType:
    names, elems = [], []
    if not sc.accept(")"):
        while True:
            names.append(sc.expect_match(IDENT, "a field name").group(0))
            sc.expect(":", "after a NamedTuple field name")
            elems.append(parse_type(sc))
            if sc.accept(")"):
                break
            sc.expect(",", "or `)` in NamedTuple fields")
    return TupleType(tuple(elems), tuple(names))


def _tensor_type(sc: Scanner, dtype, has_rank_form: bool) -> TensorType:
    """`Float(2, *, strides=[..], requires_grad=0, device=cuda:0)` and its shorter forms."""
    if not sc.peek("("):
        return TensorType(dtype)
    sc.pos += 1
    sizes, strides, device, rg, saw_dim = [], None, None, None, False
    if sc.accept(")"):
        saw_dim = True                    # `Tensor()`: rank 0
    else:
        while True:
            if sc.accept("*"):
                sizes.append(None)
                saw_dim = True
            elif sc.peek_match(INT):
                if strides is not None or device is not None or rg is not None:
                    raise sc.error("a size after keyword items in a tensor type")
                sizes.append(int(sc.match(INT).group(0)))
                saw_dim = True
            else:
                key_pos = sc.pos
                key = sc.expect_match(IDENT, "a size, `*` or `key=value` in a tensor type").group(0)
                sc.expect("=", f"after `{key}`")
                if key == "strides":
                    strides = _stride_list(sc)
                elif key == "requires_grad":
                    rg = bool(int(sc.expect_match(INT, "0 or 1").group(0)))
                elif key == "device":
                    device = sc.expect_match(_DEVICE, "a device like `cuda:0`").group(0)
                else:
                    raise sc.error(f"unknown tensor type field `{key}`", key_pos)
            if sc.accept(")"):
                break
            sc.expect(",", "or `)` in tensor type")
    if not saw_dim and not has_rank_form:
        return TensorType(dtype, None, None, device, rg)
    if strides is not None and len(strides) != len(sizes):
        raise sc.error(f"{len(strides)} strides for {len(sizes)} sizes")
    return TensorType(dtype, tuple(sizes), tuple(strides) if strides is not None else None,
                      device, rg)


def _stride_list(sc: Scanner) -> list:
    sc.expect("[", "to start the stride list")
    out = []
    if sc.accept("]"):
        return out
    while True:
        if sc.accept("*"):
            out.append(None)
        else:
            out.append(int(sc.expect_match(INT, "a stride").group(0)))
        if sc.accept("]"):
            return out
        sc.expect(",", "or `]` in stride list")


# ----- attribute values ----------------------------------------------------------------------
_LIST_KIND = {"i": "is", "f": "fs", "s": "ss", "c": "cs", "t": "ts", "g": "gs", "ty": "tys"}


def parse_attr_value(sc: Scanner) -> tuple:
    sc.nest("attribute value")
    try:
        return _attr_value(sc)
    finally:
        sc.depth -= 1


def _attr_value(sc: Scanner) -> tuple:
    c = sc.peek_char()
    start = sc.pos
    if c == '"':
        m = sc.match(_STRING)
        if not m:
            raise sc.error("unterminated string")
        try:
            return ("s", unescape_string(m.group(1)))
        except ValueError as e:
            raise sc.error(f"bad string: {e}", start) from None
    if c == "<":
        for word, kind in (("<Tensor>", "t"), ("<Graph>", "g")):
            if sc.accept(word):
                return (kind, None)
        raise sc.error(f"expected `<Tensor>` or `<Graph>`, found {sc.found()}")
    if c == "{":
        sc.pos += 1
        if sc.accept("}"):
            return ("ival", {})
        kind, v = parse_attr_value(sc)
        if sc.peek(":"):
            return ("ival", _dict_rest(sc, v))
        if kind not in ("i", "f", "c") and not (kind == "ival" and isinstance(v, bool)):
            raise sc.error("expected a number inside `{...}`", start)
        sc.expect("}", "to close the scalar tensor")
        return ("t", scalar_tensor(v))
    if c == "[":
        if TENSOR_TRAILER.match(sc.text, sc.pos):          # `[ CPUFloatType{0} ]`: empty
            return ("t", _tensor_literal(sc, start))
        return _list_value(sc)
    if c == "(":
        if sc.peek_match(_SLICE_HEADER):
            return ("t", _tensor_literal(sc, start))
        sc.pos += 1
        items = []
        if not sc.accept(")"):
            while True:
                items.append(parse_attr_value(sc)[1])
                if sc.accept(")"):
                    break
                sc.expect(",", "or `)` in tuple")
                if sc.accept(")"):
                    break
        return ("ival", tuple(items))
    m = sc.peek_match(NUMBER)
    if m:
        return _number_value(sc, m, start)
    for word, val in (("True", True), ("False", False), ("None", None)):
        if sc.keyword(word):
            return ("ival", val)
    if sc.keyword("annotate"):
        return _annotate(sc)
    if sc.peek_match(IDENT):
        return ("ty", parse_type(sc))
    raise sc.error(f"expected an attribute value, found {sc.found()}")


def _number_value(sc: Scanner, m: re.Match, start: int) -> tuple:
    sc.pos = m.end()
    text = m.group(0)
    tail = _COMPLEX_TAIL.match(sc.text, sc.pos)
    if tail:
        sc.pos = tail.end()
        return _maybe_tensor(sc, start, ("c", complex(float(text), float(tail.group(1)))))
    if re.fullmatch(r"-?\d+", text):
        return _maybe_tensor(sc, start, ("i", int(text)))
    return _maybe_tensor(sc, start, ("f", float(text)))


def _maybe_tensor(sc: Scanner, start: int, scalar: tuple) -> tuple:
    """A number followed by more than `,` / `]` / `)` / `}` / `:` begins a printed tensor."""
    c = sc.peek_char()
    if c in (",", "]", ")", "}", ":"):
        return scalar
    return ("t", _tensor_literal(sc, start))


def _tensor_literal(sc: Scanner, start: int):
    end_line = sc.text.find("\n", start)
    end_line = len(sc.text) if end_line < 0 else end_line
    m = TENSOR_TRAILER.search(sc.text, start, end_line)
    if not m:
        sc.pos = start
        raise sc.error("expected `,` or `]` after an attribute value (or a tensor literal "
                       "ending in `[ CPUFloatType{...} ]`)", start)
    try:
        t = parse_tensor_literal(sc.text[start:m.start()], m.group(1), m.group(2))
    except ValueError as e:
        raise sc.error(f"bad tensor literal: {e}", start) from None
    sc.pos = m.end()
    return t


def _annotate(sc: Scanner) -> tuple:
    """`annotate(List[int], [])`: a value with its type spelled out (empty containers, None)."""
    sc.expect("(", "after `annotate`")
    parse_type(sc)
    sc.expect(",", "after the type of `annotate(`")
    kind, value = parse_attr_value(sc)
    sc.expect(")", "to close `annotate(`")
    return kind, value


def _dict_rest(sc: Scanner, first_key) -> dict:
    """The rest of `{k: v, ...}` after its first key (keys and values are constants)."""
    out = {}
    key = first_key
    while True:
        sc.expect(":", "after a dict key")
        out[_hashable(sc, key)] = parse_attr_value(sc)[1]
        if sc.accept("}"):
            return out
        sc.expect(",", "or `}` in dict")
        key = parse_attr_value(sc)[1]


def _hashable(sc: Scanner, key):
    if isinstance(key, list):
        raise sc.error("a list cannot be a dict key")
    return key


def _list_value(sc: Scanner) -> tuple:
    sc.expect("[")
    if sc.accept("<Tensors>"):             # a tensor list whose contents were not printed
        sc.expect("]", "after `<Tensors>`")
        return ("ts", None)
    items = []
    if not sc.accept("]"):
        while True:
            items.append(parse_attr_value(sc))
            if sc.accept("]"):
                break
            sc.expect(",", "or `]` in list")
    kinds = {k for k, _ in items}
    values = [v for _, v in items]
    if not items:
        return ("is", [])
    if len(kinds) == 1 and next(iter(kinds)) in _LIST_KIND:
        return (_LIST_KIND[next(iter(kinds))], values)
    if kinds == {"i", "f"}:
        return ("fs", [float(v) for v in values])
    return ("ival", values)
