"""Imports every pass module so each registers itself by name."""
from . import alloc, fuse_align, fuse_swiglu, fuse_topk_sum, schedule, tile  # noqa: F401
