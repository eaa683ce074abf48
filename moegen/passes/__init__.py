"""Compiler passes (see manager.py for the pass manager and the default pipelines)."""
