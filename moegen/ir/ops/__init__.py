"""The op definitions; importing this package registers every op in `moegen.ir.core.OPS`."""
from . import builtin, moe, msd  # noqa: F401
