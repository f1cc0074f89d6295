"""`pyfuser.pytorch_utils`: nvFuser's `nvfuser.pytorch_utils` helpers between torch and DataType."""
from __future__ import annotations

from .errors import FusionDefinitionError
from .ir.dtypes import DataType


def torch_dtype_to_nvfuser_dtype(dtype) -> DataType:
    """The DataType of a torch.dtype (torch.float32 -> DataType.Float); also takes Python's
    bool, int, float and complex (as torch types them: Bool, Int, Double, ComplexDouble)."""
    python = {bool: DataType.Bool, int: DataType.Int, float: DataType.Double,
              complex: DataType.ComplexDouble}
    if dtype in python:
        return python[dtype]
    try:
        return DataType.from_torch(dtype)
    except (ValueError, TypeError):
        raise FusionDefinitionError(f"torch_dtype_to_nvfuser_dtype: no DataType for {dtype!r}") from None


def nvfuser_dtype_to_torch_dtype(dtype: DataType):
    """The torch.dtype of a DataType."""
    if not isinstance(dtype, DataType):
        raise FusionDefinitionError(f"nvfuser_dtype_to_torch_dtype: expects a DataType, got {dtype!r}")
    return dtype.torch
