"""Pass registry, pipeline strings and the pass manager.

A pass is a small class with a kebab-case `name`, typed `OPTIONS` and `apply(module, ctx)`.
Pipeline strings name passes with options, ``tile{moe-block=8},alloc,schedule{mode=preload}``;
they parse and print back. The manager verifies the IR after every pass.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Callable

from ..ir import Module, VerifyError
from .base import PASSES, Context, Option, Pass, PipelineError

__all__ = ["PASSES", "Context", "Option", "Pass", "PassManager", "PipelineError",
           "parse_pipeline", "print_pipeline"]


_ITEM = re.compile(r"\s*([a-z][a-z0-9-]*)\s*(?:\{([^{}]*)\})?\s*(?:,|$)")


def parse_pipeline(text: str) -> list[Pass]:
    """``a,b{k=v,k2=v2}`` -> pass instances; unknown names and options fail loudly."""
    passes, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _ITEM.match(text, pos)
        if not m or m.end() == pos:
            raise PipelineError(f"bad pipeline {text!r} at {text[pos:]!r}: expected "
                                f"'name' or 'name{{option=value,...}}'")
        name, body = m.group(1), m.group(2)
        cls = PASSES.get(name)
        if cls is None:
            raise PipelineError(f"unknown pass '{name}' (passes: {', '.join(sorted(PASSES))})")
        given = {}
        for part in filter(None, (p.strip() for p in (body or "").split(","))):
            if "=" not in part:
                raise PipelineError(f"{name}: option {part!r} must be written key=value")
            key, value = (s.strip() for s in part.split("=", 1))
            if key not in cls.OPTIONS:
                raise PipelineError(f"{name}: unknown option '{key}' (options: "
                                    f"{', '.join(cls.OPTIONS) or 'none'})")
            given[key] = cls.OPTIONS[key].parse(name, key, value)
        passes.append(cls(**given))
        pos = m.end()
    return passes


def print_pipeline(passes: list[Pass]) -> str:
    return ",".join(str(p) for p in passes)


@dataclass
class PassTiming:
    name: str
    seconds: float


class PassManager:
    """Runs passes in order, verifying after each; can print the IR after some or all."""

    def __init__(self, passes: list[Pass] | str, print_after: set[str] | None = None,
                 print_after_all: bool = False,
                 on_print: Callable[[str, Module], None] | None = None):
        self.passes = parse_pipeline(passes) if isinstance(passes, str) else list(passes)
        self.print_after = print_after or set()
        self.print_after_all = print_after_all
        self.on_print = on_print
        self.timings: list[PassTiming] = []
        unknown = self.print_after - {p.name for p in self.passes}
        if unknown:
            raise PipelineError(f"--print-ir-after={','.join(sorted(unknown))}: not in the "
                                f"pipeline '{self.pipeline}'")

    @property
    def pipeline(self) -> str:
        return print_pipeline(self.passes)

    def run(self, module: Module, ctx: Context) -> Module:
        module.verify()
        for p in self.passes:
            if ctx.spec.pipeline not in p.PIPELINES or ctx.target not in p.TARGETS:
                raise PipelineError(f"pass '{p.name}' does not apply to pipeline "
                                    f"{ctx.spec.pipeline} on target {ctx.target}")
            start = time.perf_counter()
            p.apply(module, ctx)
            try:
                module.verify()
            except VerifyError as exc:
                raise VerifyError(f"after pass '{p}': {exc}") from None
            self.timings.append(PassTiming(str(p), time.perf_counter() - start))
            if self.on_print and (self.print_after_all or p.name in self.print_after):
                self.on_print(str(p), module)
        return module

    def timing_report(self) -> str:
        total = sum(t.seconds for t in self.timings) or 1e-12
        lines = ["pass timing:", f"  {'seconds':>9}  {'share':>6}  pass"]
        for t in self.timings:
            lines.append(f"  {t.seconds:9.6f}  {100 * t.seconds / total:5.1f}%  {t.name}")
        lines.append(f"  {total:9.6f}  100.0%  total")
        return "\n".join(lines)
