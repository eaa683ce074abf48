"""`moegen.cuda`: the CUDA runtime (re-exported from moegen.targets.cuda)."""
from .targets.cuda import CudaUnavailable, MoeW4A16, MsdMatmul, PackedMoeWeights

__all__ = ["CudaUnavailable", "MoeW4A16", "MsdMatmul", "PackedMoeWeights"]
