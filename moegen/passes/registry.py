"""Imports every pass module so each registers itself by name."""
from . import alloc, fuse_align, schedule, tile  # noqa: F401
