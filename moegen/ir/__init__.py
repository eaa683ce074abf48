"""moegen's IR: typed SSA values, ops with verifiers, textual form, numpy interpreter."""
from . import ops  # noqa: F401  (registers the ops)
from .core import OPS, Attr, Block, Function, Module, Op, Value, VerifyError
from .parser import ParseError, parse
from .printer import print_module
from .types import DTYPES, Dim, DimError, IndexType, TensorType, parse_type

__all__ = ["OPS", "Attr", "Block", "DTYPES", "Dim", "DimError", "Function", "IndexType", "Module",
           "Op", "ParseError", "TensorType", "Value", "VerifyError", "parse", "parse_type",
           "print_module"]
