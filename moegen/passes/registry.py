"""Imports every pass module so each registers itself by name; describes them (`moegen passes`)."""
from __future__ import annotations

import sys
import textwrap

from . import alloc, fuse_align, fuse_swiglu, fuse_topk_sum, schedule, tile  # noqa: F401
from .base import PASSES, Option, PipelineError
from .pipelines import DEFAULT_PIPELINES


def summary(name: str) -> str:
    """A pass's one-line description: the first line of its module's docstring, without the
    leading `name`: that repeats it."""
    doc = (sys.modules[PASSES[name].__module__].__doc__ or "").strip().splitlines()
    line = doc[0] if doc else ""
    return line.split(": ", 1)[1] if line.startswith(f"`{name}`: ") else line


def _option_line(key: str, opt: Option) -> str:
    values = (", ".join(map(str, opt.choices)) if opt.choices
              else f">= {opt.minimum}" if opt.type is int else opt.type.__name__)
    default = "the pass's own" if opt.default is None else str(opt.default)
    head = f"  {key}={opt.type.__name__}  ({values}; default: {default})"
    body = textwrap.fill(opt.doc, width=96, initial_indent="      ",
                         subsequent_indent="      ")
    return f"{head}\n{body}"


def describe(name: str | None = None) -> str:
    """Every registered pass with its one-line description and the default pipelines, or one
    pass's options (`name`) with their values, defaults and meaning."""
    if name is None:
        width = max(map(len, PASSES))
        lines = ["passes (`moegen passes NAME` lists a pass's options):"]
        lines += [f"  {n:<{width}}  {summary(n)} [{', '.join(PASSES[n].PIPELINES)}]"
                  for n in sorted(PASSES)]
        lines += ["", "default pipelines:"]
        lines += [f"  {pipeline} on {target}: {','.join(passes)}"
                  for (pipeline, target), passes in DEFAULT_PIPELINES.items()]
        return "\n".join(lines)
    cls = PASSES.get(name)
    if cls is None:
        raise PipelineError(f"unknown pass '{name}' (passes: {', '.join(sorted(PASSES))})")
    lines = [f"{name}: {summary(name)}",
             f"pipelines: {', '.join(cls.PIPELINES)}; targets: {', '.join(cls.TARGETS)}"]
    if cls.OPTIONS:
        lines += [f"options, as {name}{{key=value,...}}:"]
        lines += [_option_line(key, opt) for key, opt in cls.OPTIONS.items()]
    else:
        lines += ["no options"]
    lines += ["(docs/PASSES.md has the rules behind the defaults)"]
    return "\n".join(lines)
