"""spec.yaml -> a frozen, validated `Spec`.

Every error is a `SpecError` whose message names the key path, the bad value and the rule,
e.g. ``moe.hidden_size: 2050 must be a multiple of quant.group_size (128)``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from .target import CUDA_ARCHS

PIPELINES = ("moe_w4a16", "msd_matmul")
DTYPES = ("float16", "bfloat16")
SCHEDULES = ("basic", "preload")
LOWERINGS = ("msd", "dequant")
GROUP_SIZES = (32, 64, 128)
MSD_STEPS = (1, 2, 3)
ASCEND_SOCS = ("ascend910b", "ascend910_93")
MOE_BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


class SpecError(ValueError):
    """A spec that moegen cannot serve; the message names the key, the value and the rule."""


@dataclass(frozen=True)
class MoeSpec:
    hidden_size: int
    intermediate_size: int
    num_experts: int
    top_k: int
    renormalize: bool = True
    block_size: int | None = None  # fixed moe block size; None = per token bucket (tile pass)


@dataclass(frozen=True)
class QuantSpec:
    bits: int = 4
    group_size: int = 128
    symmetric: bool = True       # False: a zero point per group and column, w = (q - z) * s
    act_order: bool = False      # GPTQ desc_act: each weight row's group given by g_idx


@dataclass(frozen=True)
class TokensSpec:
    max: int = 8192


@dataclass(frozen=True)
class MsdSpec:
    m: int
    n: int
    k: int
    steps: int = 3


@dataclass(frozen=True)
class CudaTarget:
    arch: str = "sm_90"


@dataclass(frozen=True)
class AscendTarget:
    soc: str = "ascend910b"
    aic_cores: int = 24
    aiv_cores: int = 48


@dataclass(frozen=True)
class Targets:
    cuda: CudaTarget | None = field(default_factory=CudaTarget)
    ascend: AscendTarget | None = field(default_factory=AscendTarget)


@dataclass(frozen=True)
class Spec:
    name: str
    pipeline: str
    dtype: str = "float16"
    moe: MoeSpec | None = None
    quant: QuantSpec = field(default_factory=QuantSpec)
    tokens: TokensSpec = field(default_factory=TokensSpec)
    msd: MsdSpec | None = None
    schedule: str = "preload"
    lowering: str = "msd"
    targets: Targets = field(default_factory=Targets)

    @property
    def cuda_arch(self) -> str:
        """The CUDA architecture the spec's plan is for (targets.cuda.arch; sm_90 without a
        CUDA target)."""
        return self.targets.cuda.arch if self.targets.cuda else CudaTarget.arch

    def to_dict(self) -> dict:
        """The normalised spec (defaults filled in) as plain data."""
        return asdict(self)

    @property
    def hash(self) -> str:
        """A short stable hash of the normalised spec (goes into generated headers and caches)."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# validation helpers: each names the key path, the value and the rule

def _fail(path: str, value: Any, rule: str) -> None:
    raise SpecError(f"{path}: {value!r} {rule}")


def _section(data: Mapping, path: str, allowed: tuple[str, ...]) -> None:
    if not isinstance(data, Mapping):
        _fail(path, data, "must be a mapping")
    for key in data:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            _fail(where, data[key], f"is an unknown key (allowed here: {', '.join(allowed)})")


def _int(data: Mapping, key: str, path: str, default: Any = ..., minimum: int = 1) -> int:
    if key not in data:
        if default is ...:
            _fail(f"{path}.{key}" if path else key, None, "is required")
        return default
    value = data[key]
    where = f"{path}.{key}" if path else key
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(where, value, "must be an integer")
    if value < minimum:
        _fail(where, value, f"must be >= {minimum}")
    return value


def _bool(data: Mapping, key: str, path: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        _fail(f"{path}.{key}", value, "must be true or false")
    return value


def _choice(data: Mapping, key: str, path: str, allowed: tuple, default: Any = ...) -> Any:
    where = f"{path}.{key}" if path else key
    if key not in data:
        if default is ...:
            _fail(where, None, f"is required (one of: {', '.join(map(str, allowed))})")
        return default
    value = data[key]
    if value not in allowed or isinstance(value, bool):
        _fail(where, value, f"must be one of: {', '.join(map(str, allowed))}")
    return value


def _multiple(path: str, value: int, of_path: str, of: int) -> None:
    if value % of:
        _fail(path, value, f"must be a multiple of {of_path} ({of})")


# ---------------------------------------------------------------------------------------------

def load_spec(source: "Spec | Mapping | str | Path") -> Spec:
    """A spec from a `Spec`, a dict, or a path to a YAML file."""
    if isinstance(source, Spec):
        return source
    if isinstance(source, (str, Path)):
        path = Path(source)
        try:
            text = path.read_text()
        except OSError as exc:
            raise SpecError(f"{path}: cannot read spec file ({exc.strerror})") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpecError(f"{path}: not valid YAML ({exc})") from None
        return parse_spec(data)
    return parse_spec(source)


def parse_spec(data: Any) -> Spec:
    top = ("name", "pipeline", "dtype", "moe", "quant", "tokens", "msd", "schedule", "lowering",
           "targets")
    if not isinstance(data, Mapping):
        raise SpecError(f"spec: {data!r} must be a mapping with keys {', '.join(top)}")
    _section(data, "", top)
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        _fail("name", name, "must be a non-empty string")
    pipeline = _choice(data, "pipeline", "", PIPELINES)
    dtype = _choice(data, "dtype", "", DTYPES, "float16")
    schedule = _choice(data, "schedule", "", SCHEDULES, "preload")
    lowering = _choice(data, "lowering", "", LOWERINGS, "msd")
    quant = _quant(data.get("quant", {}))
    if pipeline == "msd_matmul":
        if dtype != "float16":
            _fail("dtype", dtype, "must be float16 for pipeline: msd_matmul (its slices and "
                                  "merge are fp16)")
        if not quant.symmetric or quant.act_order:
            key = "quant.symmetric" if not quant.symmetric else "quant.act_order"
            _fail(key, getattr(quant, key.split(".")[1]), "is only supported by pipeline: "
                                                          "moe_w4a16 (MSD takes symmetric int4)")
    tk = data.get("tokens", {})
    _section(tk, "tokens", ("max",))
    tokens = TokensSpec(_int(tk, "max", "tokens", 8192))
    own, other = ("moe", "msd") if pipeline == "moe_w4a16" else ("msd", "moe")
    if other in data:
        _fail(other, data[other], f"is only allowed with pipeline: "
                                  f"{'moe_w4a16' if other == 'moe' else 'msd_matmul'}")
    if own not in data:
        _fail(own, None, f"is required for pipeline: {pipeline}")
    moe = _moe(data["moe"], quant.group_size) if own == "moe" else None
    msd = _msd(data["msd"], quant.group_size) if own == "msd" else None
    return Spec(name=name, pipeline=pipeline, dtype=dtype, moe=moe, quant=quant, tokens=tokens,
                msd=msd, schedule=schedule, lowering=lowering,
                targets=_targets(data.get("targets", {"cuda": {}, "ascend": {}})))


def _quant(q: Any) -> QuantSpec:
    _section(q, "quant", ("bits", "group_size", "symmetric", "act_order"))
    bits = _choice(q, "bits", "quant", (4,), 4)
    group = _choice(q, "group_size", "quant", GROUP_SIZES, 128)
    symmetric = _bool(q, "symmetric", "quant", True)
    act_order = _bool(q, "act_order", "quant", False)
    return QuantSpec(bits, group, symmetric, act_order)


def _moe(m: Any, group: int) -> MoeSpec:
    _section(m, "moe", ("hidden_size", "intermediate_size", "num_experts", "top_k",
                        "renormalize", "block_size"))
    moe = MoeSpec(
        hidden_size=_int(m, "hidden_size", "moe"),
        intermediate_size=_int(m, "intermediate_size", "moe"),
        num_experts=_int(m, "num_experts", "moe"),
        top_k=_int(m, "top_k", "moe"),
        renormalize=_bool(m, "renormalize", "moe", True),
        block_size=_choice(m, "block_size", "moe", MOE_BLOCK_SIZES, None),
    )
    _multiple("moe.hidden_size", moe.hidden_size, "quant.group_size", group)
    _multiple("moe.intermediate_size", moe.intermediate_size, "quant.group_size", group)
    if moe.num_experts > 512:
        _fail("moe.num_experts", moe.num_experts, "must be <= 512")
    if moe.top_k > moe.num_experts:
        _fail("moe.top_k", moe.top_k, f"must be <= moe.num_experts ({moe.num_experts})")
    return moe


def _msd(s: Any, group: int) -> MsdSpec:
    _section(s, "msd", ("m", "n", "k", "steps"))
    msd = MsdSpec(m=_int(s, "m", "msd"), n=_int(s, "n", "msd"), k=_int(s, "k", "msd"),
                  steps=_choice(s, "steps", "msd", MSD_STEPS, 3))
    _multiple("msd.k", msd.k, "quant.group_size", group)
    return msd


def _targets(t: Any) -> Targets:
    _section(t, "targets", ("cuda", "ascend"))
    cuda = ascend = None
    if "cuda" in t:
        c = t["cuda"] or {}
        _section(c, "targets.cuda", ("arch",))
        cuda = CudaTarget(_choice(c, "arch", "targets.cuda", CUDA_ARCHS, CudaTarget.arch))
    if "ascend" in t:
        a = t["ascend"] or {}
        _section(a, "targets.ascend", ("soc", "aic_cores", "aiv_cores"))
        ascend = AscendTarget(
            soc=_choice(a, "soc", "targets.ascend", ASCEND_SOCS, "ascend910b"),
            aic_cores=_int(a, "aic_cores", "targets.ascend", 24),
            aiv_cores=_int(a, "aiv_cores", "targets.ascend", 48),
        )
        if ascend.aiv_cores != 2 * ascend.aic_cores:
            _fail("targets.ascend.aiv_cores", ascend.aiv_cores,
                  f"must be 2 x targets.ascend.aic_cores ({2 * ascend.aic_cores}): "
                  "the MSD kernel runs 1 AIC : 2 AIV")
    if cuda is None and ascend is None:
        _fail("targets", t, "must name at least one of: cuda, ascend")
    return Targets(cuda=cuda, ascend=ascend)
