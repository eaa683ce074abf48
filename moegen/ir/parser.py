"""Parser of the textual form printed by `printer.py` (one op per line, `//` comments).

Errors are `ParseError`s naming the source, the line and what was expected. `parse` also binds
symbols when given an environment (``{"H": 2048, ...}``): every dimension and symbolic attribute
is evaluated, so a pipeline file can be instantiated for one spec.
"""
from __future__ import annotations

import json
import re

from .core import OPS, Block, Function, Module, Op, Value
from .types import Dim, DimError, parse_type


class ParseError(ValueError):
    pass


_FLOAT = re.compile(r"-?\d+\.\d*(?:e[-+]?\d+)?|-?\d+e[-+]?\d+")
_DIM = re.compile(r"-?[0-9A-Z_?][0-9A-Z_?*/+\-]*")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VALUE = re.compile(r"%([A-Za-z0-9_]+)")
_SYMBOL = re.compile(r'@(?:([A-Za-z_][A-Za-z0-9_.]*)|("(?:[^"\\]|\\.)*"))')
_OP_LINE = re.compile(
    r"^(?:(?P<results>%[A-Za-z0-9_]+(?:\s*,\s*%[A-Za-z0-9_]+)*)\s*=\s*)?"
    r"(?P<name>[a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)?)\((?P<operands>[^)]*)\)\s*"
    r"(?P<rest>.*)$")


class _Cursor:
    """Character cursor over one line, for attributes and type lists."""

    def __init__(self, text: str, where: str):
        self.text, self.pos, self.where = text, 0, where

    def fail(self, what: str):
        raise ParseError(f"{self.where}: expected {what} at {self.text[self.pos:self.pos + 30]!r}")

    def skip(self):
        while self.pos < len(self.text) and self.text[self.pos] == " ":
            self.pos += 1

    def peek(self, s: str) -> bool:
        self.skip()
        return self.text.startswith(s, self.pos)

    def eat(self, s: str):
        if not self.peek(s):
            self.fail(repr(s))
        self.pos += len(s)

    def match(self, pattern: re.Pattern):
        self.skip()
        m = pattern.match(self.text, self.pos)
        if m:
            self.pos = m.end()
        return m

    def attrs(self, env: dict | None) -> dict:
        self.eat("{")
        out: dict = {}
        if self.peek("}"):
            self.eat("}")
            return out
        while True:
            key = self.match(_IDENT)
            if not key:
                self.fail("an attribute name")
            self.eat("=")
            out[key.group(0)] = self.attr_value(env)
            if self.peek(","):
                self.eat(",")
                continue
            self.eat("}")
            return out

    def attr_value(self, env: dict | None):
        self.skip()
        if self.peek("{"):
            return self.attrs(env)
        if self.peek("["):
            self.eat("[")
            items = []
            if not self.peek("]"):
                while True:
                    items.append(self.attr_value(env))
                    if self.peek(","):
                        self.eat(",")
                        continue
                    break
            self.eat("]")
            return items
        if self.peek('"'):
            m = self.match(re.compile(r'"(?:[^"\\]|\\.)*"'))
            if not m:
                self.fail("a closed string")
            return json.loads(m.group(0))
        for word, value in (("true", True), ("false", False)):
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                return value
        m = self.match(_FLOAT)
        if m:
            return float(m.group(0))
        m = self.match(_DIM)
        if not m:
            self.fail("an attribute value")
        try:
            dim = Dim.parse(m.group(0).lstrip("-"))
            if m.group(0).startswith("-"):
                dim = dim * -1
            if env:
                dim = dim.subs(env)
        except DimError as exc:
            raise ParseError(f"{self.where}: {exc}") from None
        return dim.value if dim.is_static else dim

    def type_list(self, env: dict | None) -> list:
        self.eat("(")
        types = []
        if not self.peek(")"):
            while True:
                self.skip()
                m = self.match(re.compile(r"tensor<[^>]*>|index"))
                if not m:
                    self.fail("a type")
                types.append(_type(m.group(0), env, self.where))
                if self.peek(","):
                    self.eat(",")
                    continue
                break
        self.eat(")")
        return types


def _type(text: str, env: dict | None, where: str):
    try:
        t = parse_type(text)
        return t.subs(env) if env else t
    except DimError as exc:
        raise ParseError(f"{where}: {exc}") from None


def _symbol(c: _Cursor) -> str:
    m = c.match(_SYMBOL)
    if not m:
        c.fail("a @name")
    return m.group(1) if m.group(1) else json.loads(m.group(2))


def _typed_args(text: str, env, where: str) -> list[tuple[str, object]]:
    out = []
    for part in filter(None, (p.strip() for p in _split_top(text))):
        m = re.match(r"^%([A-Za-z0-9_]+)\s*:\s*(.+)$", part)
        if not m:
            raise ParseError(f"{where}: expected '%name: type', got {part!r}")
        out.append((m.group(1), _type(m.group(2), env, where)))
    return out


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def parse(text: str, source: str = "<input>", env: dict | None = None) -> Module:
    """Parse a module; `env` binds symbols (e.g. ``{"H": 2048}``) while parsing."""
    lines = text.splitlines()
    i = 0

    def where(n: int) -> str:
        return f"{source}:{n}"

    def next_line():
        nonlocal i
        while i < len(lines):
            raw = lines[i]
            i += 1
            code = raw.split("//", 1)[0].strip()
            if code:
                return i, code
        return None, None

    n, line = next_line()
    if line is None or not line.startswith("module"):
        raise ParseError(f"{where(n or 1)}: expected 'module @name {{'")
    c = _Cursor(line, where(n))
    c.eat("module")
    name = _symbol(c)
    mattrs = {}
    if c.peek("attributes"):
        c.eat("attributes")
        mattrs = c.attrs(env)
    c.eat("{")
    if c.text[c.pos:].strip():
        c.fail("end of line")

    functions = []
    while True:
        n, line = next_line()
        if line is None:
            raise ParseError(f"{where(len(lines))}: module is not closed with '}}'")
        if line == "}":
            break
        functions.append(_parse_function(line, n, next_line, where, env))
    n2, extra = next_line()
    if extra is not None:
        raise ParseError(f"{where(n2)}: unexpected text after the module: {extra!r}")
    return Module(name, functions, mattrs)


def _parse_function(line, n, next_line, where, env) -> Function:
    m = re.match(r"^func\s+(@\S+?)\((.*)\)\s*->\s*(\(.*\))\s*\{$", line)
    if not m:
        raise ParseError(f"{where(n)}: expected 'func @name(%arg: type, ...) -> (types) {{'")
    name = _symbol(_Cursor(m.group(1), where(n)))
    scope: dict[str, Value] = {}
    block = Block()
    for arg, t in _typed_args(m.group(2), env, where(n)):
        v = Value(arg, t, block)
        block.args.append(v)
        scope[arg] = v
    results = _Cursor(m.group(3), where(n)).type_list(env)
    fn = Function(name, block, results, line=n)
    _parse_block_body(block, next_line, where, env, scope)
    return fn


def _parse_block_body(block: Block, next_line, where, env, scope) -> None:
    while True:
        n, line = next_line()
        if line is None:
            raise ParseError(f"{where(n or 0)}: block is not closed with '}}'")
        if line == "}":
            return
        block.ops.append(_parse_op(line, n, next_line, where, env, scope))


def _parse_op(line, n, next_line, where, env, scope) -> Op:
    m = _OP_LINE.match(line)
    if not m:
        raise ParseError(f"{where(n)}: expected '%results = dialect.op(%operands) {{attrs}} : "
                         f"(types) -> (types)', got {line!r}")
    opname = m.group("name")
    cls = OPS.get(opname)
    if cls is None:
        raise ParseError(f"{where(n)}: unknown op '{opname}' (known: {', '.join(sorted(OPS))})")
    operands = []
    for tok in filter(None, (t.strip() for t in m.group("operands").split(","))):
        vm = _VALUE.fullmatch(tok)
        if not vm:
            raise ParseError(f"{where(n)}: expected an operand '%name', got {tok!r}")
        if vm.group(1) not in scope:
            raise ParseError(f"{where(n)}: %{vm.group(1)} is used before it is defined")
        operands.append(scope[vm.group(1)])
    c = _Cursor(m.group("rest"), where(n))
    attrs = c.attrs(env) if c.peek("{") else {}
    c.eat(":")
    in_types = c.type_list(env)
    c.eat("->")
    out_types = c.type_list(env)
    has_region = c.peek("{")
    if has_region:
        c.eat("{")
    if c.text[c.pos:].strip():
        c.fail("end of line")
    if [v.type for v in operands] != in_types:
        raise ParseError(f"{where(n)}: operand types ({', '.join(str(v.type) for v in operands)}) "
                         f"differ from the declared ({', '.join(map(str, in_types))})")
    names = [r.strip()[1:] for r in m.group("results").split(",")] if m.group("results") else []
    if len(names) != len(out_types):
        raise ParseError(f"{where(n)}: {len(names)} result names but {len(out_types)} result types")
    region = None
    if has_region:
        bn, bline = next_line()
        bm = re.match(r"^\^[A-Za-z0-9_]+\((.*)\):$", bline or "")
        if not bm:
            raise ParseError(f"{where(bn or n)}: expected a block label '^body(%arg: type, ...):'")
        region = Block()
        inner = dict(scope)
        for arg, t in _typed_args(bm.group(1), env, where(bn)):
            v = Value(arg, t, region)
            region.args.append(v)
            inner[arg] = v
        _parse_block_body(region, next_line, where, env, inner)
    op = cls(operands, out_types, attrs, region=region, result_names=names, line=n)
    for r in op.results:
        scope[r.name] = r
    return op
