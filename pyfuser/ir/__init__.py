"""Fusion IR: values, tensor views, iter domains, exprs, the op table, builder, printer, evaluator.

Public surface used by frontends, schedulers and codegen:
- Fusion (context manager), TensorView, IterDomain, Scalar, DataType, ParallelType, IterType
- builder functions (pyfuser.ir.builder as B): B.define_tensor, B.elementwise(name, ...), B.cast...
- OPS / REDUCTIONS (the op table), bind() (run-time sizes)
"""
from .base import Expr, Scalar, Val  # noqa: F401
from .dtypes import DataType, Promotion  # noqa: F401
from .fusion import Fusion  # noqa: F401
from .iterdomain import IterDomain, IterType, ParallelType  # noqa: F401
from .ops import OPS, REDUCTIONS  # noqa: F401
from .shapes import Bindings, bind  # noqa: F401
from .tensor import MemoryType, TensorView  # noqa: F401
