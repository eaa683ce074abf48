"""What every pass is made of: the Pass base class (registered by name as it is defined), its
typed options, the context passes read besides the IR, and the error a bad pipeline string
raises."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ..spec import Spec
from ..target import GpuTarget, gpu_target

if TYPE_CHECKING:
    from ..ir import Module


def option_text(value: Any) -> str:
    """An option value as a pipeline string writes it (booleans as true / false)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


class PipelineError(ValueError):
    """A pipeline string names an unknown pass or option, or an option value is bad."""


@dataclass(frozen=True)
class Option:
    type: type                  # int, str or bool
    default: Any
    doc: str
    choices: tuple = ()
    minimum: int = 1            # ints

    def kind(self) -> str:
        """What a value of this option must be, as an error says it."""
        return {int: "an integer", bool: "true or false"}.get(self.type, "text")

    def parse(self, pass_name: str, key: str, text: str) -> Any:
        try:
            if self.type is bool:
                if text not in ("true", "false"):
                    raise ValueError
                value = text == "true"
            else:
                value = self.type(text)
        except ValueError:
            raise PipelineError(f"{pass_name}{{{key}={text}}}: must be {self.kind()}") from None
        if self.choices and value not in self.choices:
            raise PipelineError(f"{pass_name}{{{key}={text}}}: must be one of "
                                f"{', '.join(map(str, self.choices))}")
        if self.type is int and value < self.minimum:
            raise PipelineError(f"{pass_name}{{{key}={text}}}: must be >= {self.minimum}")
        return value


PASSES: dict[str, type["Pass"]] = {}


@dataclass
class Context:
    """What passes may read besides the IR: the spec, the target, the tuning database."""
    spec: Spec
    target: str = "cuda"
    tuning: Any = None          # a tuning database (autotune); None = documented defaults
    arch: str | None = None     # CUDA: the architecture the plan is for (None: the spec's)
    gpu: GpuTarget | None = None   # CUDA: the GPU's numbers, where not the arch's table entry
    results: dict = field(default_factory=dict)   # pass name -> what it computed (for reports)

    def gpu_target(self) -> GpuTarget:
        """The GPU the plan is for: the one given, else the table's entry of the plan's arch."""
        return self.gpu or gpu_target(self.arch or self.spec.cuda_arch)


class Pass:
    name: ClassVar[str] = ""
    OPTIONS: ClassVar[dict[str, Option]] = {}
    TARGETS: ClassVar[tuple[str, ...]] = ("cuda", "ascend")
    PIPELINES: ClassVar[tuple[str, ...]] = ("moe_w4a16", "msd_matmul")

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.name:
            PASSES[cls.name] = cls

    def __init__(self, **given):
        self.given = dict(given)   # options written in the pipeline string, in order
        for key in given:
            if key not in self.OPTIONS:
                raise PipelineError(f"{self.name}: unknown option '{key}' (options: "
                                    f"{', '.join(self.OPTIONS) or 'none'})")

    def option(self, key: str, default: Any = None) -> Any:
        if key in self.given:
            return self.given[key]
        opt = self.OPTIONS[key].default
        return default if opt is None else opt

    def apply(self, module: Module, ctx: Context) -> None:
        raise NotImplementedError

    def __str__(self) -> str:
        if not self.given:
            return self.name
        opts = ",".join(f"{k}={option_text(v)}" for k, v in self.given.items())
        return f"{self.name}{{{opts}}}"
