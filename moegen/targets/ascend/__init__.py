"""The Ascend target: an AscendC custom-operator project for the MSD matmul (CANN layout)."""
from .emitter import emit_msd_project, op_names

__all__ = ["emit_msd_project", "op_names"]
