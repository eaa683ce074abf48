"""IR objects: values, ops (with their contract), blocks, functions and modules.

An op class carries its whole contract in one place: its name, operand and result names,
attributes (kind, default), whether it has a body region, and `verify()`. Op classes register
themselves by name; the parser and the passes look them up in `OPS`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

from .types import Dim, DimError, IndexType, TensorType, Type


class VerifyError(ValueError):
    """An IR rule is broken; the message names the line (when known), the op and the rule."""


@dataclass(eq=False)
class Value:
    name: str          # SSA name without the '%'
    type: Type
    owner: Any = None  # the Op that defines it, or the Block whose argument it is

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


@dataclass(frozen=True)
class Attr:
    """How an attribute is typed. kind: int, float, bool, str, dim, floats, ints, dict, any.
    choice: a kernel choice (tile, schedule, placement), which does not change what the op
    computes; the interpreter leaves those out."""
    kind: str
    default: Any = ...  # ... = required
    choice: bool = False

    @property
    def required(self) -> bool:
        return self.default is ...


OPS: dict[str, type["Op"]] = {}

# Attributes the alloc pass may put on any op: the workspace offset of each result
# (-1 = not in the workspace: a view, or a value the caller provides).
PASS_ATTRS = {"offsets": Attr("ints", None, choice=True)}


def _attr_ok(kind: str, value: Any) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "dim":
        return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, Dim)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "floats":
        return isinstance(value, list) and all(_attr_ok("float", v) for v in value)
    if kind == "ints":
        return isinstance(value, list) and all(_attr_ok("int", v) for v in value)
    if kind == "dict":
        return isinstance(value, dict)
    return True


class Op:
    NAME: ClassVar[str] = ""
    OPERANDS: ClassVar[tuple[str, ...]] = ()   # a name ending in '*' takes the rest (variadic)
    RESULTS: ClassVar[tuple[str, ...]] = ()    # a name ending in '?' is an optional last result
    ATTRS: ClassVar[dict[str, Attr]] = {}
    REGION: ClassVar[bool] = False
    TERMINATOR: ClassVar[bool] = False

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.NAME:
            OPS[cls.NAME] = cls

    def __init__(self, operands: list[Value], result_types: list[Type], attrs: dict | None = None,
                 region: "Block | None" = None, result_names: list[str] | None = None,
                 line: int | None = None):
        self.operands = list(operands)
        names = result_names or [r.rstrip("?") for r in self.RESULTS[:len(result_types)]]
        self.results = [Value(n, t, self) for n, t in zip(names, result_types)]
        self.attrs = dict(attrs or {})
        self.region = region
        if region is not None:
            region.parent = self
        self.line = line

    # attribute access with defaults
    def attr(self, name: str) -> Any:
        if name in self.attrs:
            return self.attrs[name]
        spec = self.ATTRS.get(name) or PASS_ATTRS.get(name)
        if spec is None or spec.required:
            raise KeyError(name)
        return spec.default

    def operand(self, name: str) -> Value:
        return self.operands[self.OPERANDS.index(name)]

    def result(self, name: str) -> Value:
        return self.results[[r.rstrip("?") for r in self.RESULTS].index(name)]

    # diagnostics -------------------------------------------------------------------------
    def error(self, rule: str) -> VerifyError:
        where = f"line {self.line}: " if self.line else ""
        return VerifyError(f"{where}{self.NAME}: {rule}")

    def check(self, cond: bool, rule: str) -> None:
        if not cond:
            raise self.error(rule)

    def tensor(self, value: Value, what: str, dtype: str | None = None,
               rank: int | None = None) -> TensorType:
        t = value.type
        self.check(isinstance(t, TensorType), f"{what} %{value.name} must be a tensor, got {t}")
        if dtype is not None:
            self.check(t.dtype == dtype, f"{what} %{value.name} must have element type {dtype}, "
                                         f"got {t.dtype}")
        if rank is not None:
            self.check(t.rank == rank, f"{what} %{value.name} must have rank {rank}, got {t}")
        return t

    def same_dim(self, a: Dim, b: Any, rule: str) -> None:
        self.check(Dim.of(a) == Dim.of(b), f"{rule} ({a} vs {Dim.of(b)})")

    def expect_result(self, index: int, shape: tuple, dtype: str) -> None:
        want = TensorType(tuple(shape), dtype)
        got = self.results[index].type
        self.check(got == want, f"result %{self.results[index].name} must be {want}, got {got}")

    def expect_operand(self, index: int, shape: tuple, dtype: str) -> None:
        v = self.operands[index]
        t = self.tensor(v, self.OPERANDS[index].rstrip("*"), dtype, len(shape))
        want = tuple(Dim.of(d) for d in shape)
        self.check(t.shape == want, f"{self.OPERANDS[index]} %{v.name} must have shape "
                                    f"{'x'.join(map(str, want))}, got {t}")

    # contract ----------------------------------------------------------------------------
    def verify_signature(self) -> None:
        fixed = [o for o in self.OPERANDS if not o.endswith("*")]
        variadic = len(fixed) != len(self.OPERANDS)
        n = len(self.operands)
        self.check(n == len(fixed) or (variadic and n >= len(fixed)),
                   f"takes {len(fixed)}{'+' if variadic else ''} operands "
                   f"({', '.join(self.OPERANDS)}), got {n}")
        required = len([r for r in self.RESULTS if not r.endswith("?")])
        self.check(required <= len(self.results) <= len(self.RESULTS),
                   f"gives {len(self.RESULTS)} results ({', '.join(self.RESULTS)}), "
                   f"got {len(self.results)}")
        for key, value in self.attrs.items():
            spec = self.ATTRS.get(key) or PASS_ATTRS.get(key)
            self.check(spec is not None,
                       f"unknown attribute '{key}' (allowed: {', '.join(self.ATTRS) or 'none'})")
            self.check(_attr_ok(spec.kind, value),
                       f"attribute {key} = {value!r} must be of kind {spec.kind}")
        for key, spec in self.ATTRS.items():
            self.check(not spec.required or key in self.attrs, f"attribute '{key}' is required")
        offsets = self.attrs.get("offsets")
        if offsets is not None:
            self.check(len(offsets) == len(self.results),
                       f"attribute offsets has {len(offsets)} entries for {len(self.results)} "
                       "results")
        self.check(self.REGION == (self.region is not None),
                   "must have a body region" if self.REGION else "must not have a region")

    def verify(self) -> None:
        """Op-specific shape, dtype and attribute rules (override)."""

    def __repr__(self) -> str:
        return f"<{self.NAME} line {self.line}>"


@dataclass(eq=False)
class Block:
    args: list[Value] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    parent: Any = None


@dataclass(eq=False)
class Function:
    name: str
    body: Block
    result_types: list[Type]
    line: int | None = None

    @property
    def args(self) -> list[Value]:
        return self.body.args

    @property
    def ops(self) -> list[Op]:
        return self.body.ops

    def op(self, name: str) -> Op:
        """The first top-level op called `name` (e.g. "msd.group_loop")."""
        found = next((op for op in self.body.ops if op.NAME == name), None)
        if found is None:
            raise KeyError(f"function @{self.name} has no {name} op")
        return found

    def walk(self) -> Iterator[Op]:
        """Every op, nested regions included, in program order."""
        def rec(block):
            for op in block.ops:
                yield op
                if op.region is not None:
                    yield from rec(op.region)
        yield from rec(self.body)

    def graph(self):
        """The dataflow graph of the top-level ops as a networkx.DiGraph (derived each call,
        never stored; networkx comes with the dev extra: nothing in moegen needs it to run).

        Nodes are op indices (attribute `op`); function arguments are nodes named
        ``arg:NAME``; an edge carries the value it stands for (attribute `value`). A region op's
        node also depends on values its body reads from outside.
        """
        import networkx as nx
        g = nx.DiGraph()
        producer: dict[int, Any] = {}
        for a in self.args:
            node = f"arg:{a.name}"
            g.add_node(node, value=a)
            producer[id(a)] = node
        for i, op in enumerate(self.ops):
            g.add_node(i, op=op)
            for r in op.results:
                producer[id(r)] = i
            for v in _used_values(op):
                src = producer.get(id(v))
                if src is not None:
                    g.add_edge(src, i, value=v)
        return g


def _used_values(op: Op) -> list[Value]:
    """Operands of op plus the values its region reads from outside the region."""
    used = list(op.operands)
    if op.region is not None:
        inner = {id(a) for a in op.region.args}
        for nested in op.region.ops:
            inner.update(id(r) for r in nested.results)
        for nested in op.region.ops:
            for v in _used_values(nested):
                if id(v) not in inner:
                    used.append(v)
    return used


@dataclass(eq=False)
class Module:
    name: str
    functions: list[Function]
    attrs: dict = field(default_factory=dict)

    def function(self, name: str | None = None) -> Function:
        if name is None:
            return self.functions[0]
        for f in self.functions:
            if f.name == name:
                return f
        raise KeyError(name)

    def verify(self) -> None:
        for fn in self.functions:
            verify_function(fn)

    def __str__(self) -> str:
        from .printer import print_module
        return print_module(self)


def verify_function(fn: Function) -> None:
    defined: set[int] = set()
    names: set[str] = set()

    def define(v: Value, line):
        if v.name in names:
            where = f"line {line}: " if line else ""
            raise VerifyError(f"{where}%{v.name} is defined twice (SSA values are defined once)")
        names.add(v.name)
        defined.add(id(v))

    def rec(block: Block, terminator: str, result_types: list):
        for a in block.args:
            define(a, fn.line)
        for i, op in enumerate(block.ops):
            for v in op.operands:
                if id(v) not in defined:
                    raise op.error(f"operand %{v.name} is used before it is defined")
            op.verify_signature()
            is_last = i == len(block.ops) - 1
            if op.TERMINATOR and not is_last:
                raise op.error("a terminator must be the last op of its block")
            if op.region is not None:
                rec(op.region, "msd.yield", [r.type for r in op.results])
            try:
                op.verify()
            except DimError as exc:
                raise op.error(str(exc)) from None
            for r in op.results:
                define(r, op.line)
        last = block.ops[-1] if block.ops else None
        if last is None or last.NAME != terminator:
            line = last.line if last is not None else fn.line
            where = f"line {line}: " if line else ""
            raise VerifyError(f"{where}a block must end with {terminator}")
        got = [v.type for v in last.operands]
        if got != list(result_types):
            raise last.error(f"returns ({', '.join(map(str, got))}) but the enclosing op "
                             f"declares ({', '.join(map(str, result_types))})")

    rec(fn.body, "return", fn.result_types)


__all__ = ["Attr", "Block", "Function", "IndexType", "Module", "OPS", "Op", "TensorType", "Value",
           "VerifyError", "verify_function"]
