"""IR types: the dtype table, symbolic dimensions and tensor types.

A dimension is a small polynomial over symbols: an integer (``2048``), the dynamic token count
``?``, a spec symbol (``H``, ``E``, ...) or a sum of products of those (``?*K``, ``2*I``, ``H/G``,
``?*K+E*B``). Symbols are upper case, so the ``x`` that separates dims in ``tensor<?xHxf16>``
is never part of one. `Dim.subs` binds symbols; a dim whose only symbol is ``?`` is what a
bound (built) module holds. Printing is canonical, so parse(print(d)) prints the same.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

DYN = "?"


@dataclass(frozen=True)
class DType:
    name: str       # IR spelling
    bits: int
    numpy: str      # numpy dtype that holds one element in the interpreter
    cuda: str       # CUDA C++ type of one element (i4 is packed two per byte)
    ascend: str     # AscendC type


# The one table every part of moegen reads dtypes from.
DTYPES: dict[str, DType] = {d.name: d for d in (
    DType("f16", 16, "float16", "half", "half"),
    DType("bf16", 16, "bfloat16", "__nv_bfloat16", "bfloat16_t"),
    DType("f32", 32, "float32", "float", "float"),
    DType("i32", 32, "int32", "int32_t", "int32_t"),
    DType("i8", 8, "int8", "int8_t", "int8_t"),
    DType("i4", 4, "int8", "uint8_t", "int4b_t"),
)}

# An element type may be a symbol (upper case, as dims) that the spec binds, e.g. A for the
# activations' type: tensor<?xHxA> is tensor<?xHxf16> or tensor<?xHxbf16> once built.
_ELEMENT_SYMBOL = re.compile(r"[A-Z][A-Z0-9_]*")


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype that holds one element of IR type `name` (bf16: ml_dtypes.bfloat16)."""
    spelled = DTYPES[name].numpy
    if spelled == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(spelled)
_TOKEN = re.compile(r"\s*(?:(\d+)|(\?|[A-Z][A-Z0-9_]*)|([-+*/]))")


class DimError(ValueError):
    pass


class Dim:
    """A dimension: {monomial: coefficient}; a monomial is a sorted tuple of (symbol, power)."""

    __slots__ = ("terms",)

    def __init__(self, terms: dict):
        self.terms = {m: c for m, c in terms.items() if c != 0}

    # construction ------------------------------------------------------------------------
    @staticmethod
    def of(value: "int | str | Dim") -> "Dim":
        if isinstance(value, Dim):
            return value
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return Dim({(): Fraction(int(value))})
        if isinstance(value, str):
            return Dim.parse(value)
        raise DimError(f"not a dimension: {value!r}")

    @staticmethod
    def parse(text: str) -> "Dim":
        pos, tokens = 0, []
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise DimError(f"bad dimension {text!r} at {text[pos:]!r}")
            tokens.append(m.groups())
            pos = m.end()
        if not tokens:
            raise DimError("empty dimension")
        total: dict = {}
        sign, i = 1, 0
        while True:
            coef, mono = Fraction(sign), {}
            op = "*"
            while True:
                if i >= len(tokens) or tokens[i][2] is not None:
                    raise DimError(f"bad dimension {text!r}: expected a number or symbol")
                num, sym, _ = tokens[i]
                i += 1
                if num is not None:
                    coef = coef * int(num) if op == "*" else coef / int(num)
                else:
                    mono[sym] = mono.get(sym, 0) + (1 if op == "*" else -1)
                if i < len(tokens) and tokens[i][2] in ("*", "/"):
                    op = tokens[i][2]
                    i += 1
                    continue
                break
            key = tuple(sorted((s, p) for s, p in mono.items() if p))
            total[key] = total.get(key, Fraction(0)) + coef
            if i >= len(tokens):
                break
            if tokens[i][2] not in ("+", "-"):
                raise DimError(f"bad dimension {text!r}")
            sign = 1 if tokens[i][2] == "+" else -1
            i += 1
        return Dim(total)

    # queries -----------------------------------------------------------------------------
    @property
    def symbols(self) -> set[str]:
        return {s for mono in self.terms for s, _ in mono}

    @property
    def is_static(self) -> bool:
        return not self.symbols

    @property
    def value(self) -> int:
        if not self.is_static:
            raise DimError(f"dimension {self} is not static")
        c = self.terms.get((), Fraction(0))
        if c.denominator != 1:
            raise DimError(f"dimension {self} is not an integer")
        return int(c)

    def subs(self, env: dict) -> "Dim":
        """Bind symbols (names -> ints); unbound symbols stay."""
        out: dict = {}
        for mono, coef in self.terms.items():
            c, rest = coef, []
            for s, p in mono:
                if isinstance(env.get(s), (int, np.integer)):     # (element symbols: str)
                    c *= Fraction(int(env[s])) ** p
                else:
                    rest.append((s, p))
            key = tuple(rest)
            out[key] = out.get(key, Fraction(0)) + c
        d = Dim(out)
        if d.is_static and d.terms.get((), Fraction(0)).denominator != 1:
            raise DimError(f"dimension {self} is not an integer under {env}")
        return d

    def eval(self, env: dict) -> int:
        return self.subs(env).value

    # arithmetic used by verifiers --------------------------------------------------------
    def __mul__(self, other) -> "Dim":
        other = Dim.of(other)
        out: dict = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in other.terms.items():
                powers: dict = {}
                for s, p in m1 + m2:
                    powers[s] = powers.get(s, 0) + p
                key = tuple(sorted((s, p) for s, p in powers.items() if p))
                out[key] = out.get(key, Fraction(0)) + c1 * c2
        return Dim(out)

    __rmul__ = __mul__

    def __truediv__(self, other) -> "Dim":
        other = Dim.of(other)
        if len(other.terms) != 1:
            raise DimError(f"cannot divide by {other}")
        (mono, coef), = other.terms.items()
        inv = Dim({tuple((s, -p) for s, p in mono): 1 / coef})
        return self * inv

    def __add__(self, other) -> "Dim":
        other = Dim.of(other)
        out = dict(self.terms)
        for m, c in other.terms.items():
            out[m] = out.get(m, Fraction(0)) + c
        return Dim(out)

    __radd__ = __add__

    def __eq__(self, other) -> bool:
        try:
            return self.terms == Dim.of(other).terms
        except DimError:
            return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.terms.items())))

    # printing ----------------------------------------------------------------------------
    def __str__(self) -> str:
        if not self.terms:
            return "0"

        def order(item):
            mono, _ = item
            return (-sum(abs(p) for _, p in mono), [(s != DYN, s) for s, _ in mono])

        parts = []
        for mono, coef in sorted(self.terms.items(), key=order):
            num = [s for s, p in mono for _ in range(p) if p > 0]
            den = [s for s, p in mono for _ in range(-p) if p < 0]
            sign = "-" if coef < 0 else "+"
            a = abs(coef)
            factors = ([str(a.numerator)] if a.numerator != 1 or not num else []) + num
            text = "*".join(factors)
            for d in ([str(a.denominator)] if a.denominator != 1 else []) + den:
                text += "/" + d
            parts.append((sign, text))
        first_sign, first = parts[0]
        out = ("-" if first_sign == "-" else "") + first
        for sign, text in parts[1:]:
            out += sign + text
        return out

    def __repr__(self) -> str:
        return f"Dim({str(self)!r})"


@dataclass(frozen=True)
class TensorType:
    shape: tuple  # of Dim
    dtype: str

    def __post_init__(self):
        if self.dtype not in DTYPES and not _ELEMENT_SYMBOL.fullmatch(self.dtype):
            raise DimError(f"unknown element type {self.dtype!r} (known: {', '.join(DTYPES)}, "
                           "or an upper-case symbol the spec binds)")
        object.__setattr__(self, "shape", tuple(Dim.of(d) for d in self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    def subs(self, env: dict) -> "TensorType":
        dtype = env.get(self.dtype, self.dtype) if self.dtype not in DTYPES else self.dtype
        if dtype not in DTYPES and not _ELEMENT_SYMBOL.fullmatch(str(dtype)):
            raise DimError(f"element type {self.dtype} bound to {dtype!r}, not one of "
                           f"{', '.join(DTYPES)}")
        return TensorType(tuple(d.subs(env) for d in self.shape), dtype)

    def num_bytes(self, env: dict) -> int:
        """Bytes of one instance with every symbol bound by env (``?`` included)."""
        n = 1
        for d in self.shape:
            n *= d.eval(env)
        return (n * DTYPES[self.dtype].bits + 7) // 8

    def __str__(self) -> str:
        return "tensor<" + "".join(f"{d}x" for d in self.shape) + self.dtype + ">"


@dataclass(frozen=True)
class IndexType:
    def subs(self, env: dict) -> "IndexType":
        return self

    def __str__(self) -> str:
        return "index"


Type = TensorType | IndexType


def parse_type(text: str) -> Type:
    text = text.strip()
    if text == "index":
        return IndexType()
    if not (text.startswith("tensor<") and text.endswith(">")):
        raise DimError(f"bad type {text!r}: expected tensor<...> or index")
    body = text[len("tensor<"):-1]
    parts = body.split("x")
    if not parts or not (parts[-1] in DTYPES or _ELEMENT_SYMBOL.fullmatch(parts[-1])):
        raise DimError(f"bad type {text!r}: element type must be one of {', '.join(DTYPES)} "
                       "or an upper-case symbol")
    return TensorType(tuple(Dim.parse(p) for p in parts[:-1]), parts[-1])
