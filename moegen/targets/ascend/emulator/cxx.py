"""Translate the emitted AscendC kernel (a small subset of C++) into Python.

The emulator runs exactly the code moegen emits: this module reads the op_kernel sources
(following their project-relative includes), parses the C++ the templates are written in, and
writes a Python module whose functions and classes do what the C++ does, calling the AscendC API
of `runtime.py`. What is outside the subset is refused with the file and line, so a template
that grows past it says so instead of being emulated wrongly.

The subset: `#include`, `#pragma`, object-like `#define`; constexpr globals and arrays; free
functions and function templates; classes and structs with fields, `using` aliases and methods
(class templates with value parameters); statements: declarations (with `=`, `{...}` or no
initialiser; arrays), assignments (`=`, `op=`, `++`), calls, `if` / `else` (`if constexpr`,
`if ASCEND_IS_AIC`), `for`, `return`, blocks; expressions with the C operators, `?:`,
`static_cast` / `reinterpret_cast`, `sizeof`, template arguments and brace construction.

C semantics kept: integer division and remainder truncate, values are converted to their
declared C type at every declaration, assignment, parameter and return (uint32_t wraps, float is
float32), and struct values are copied. Every user function becomes a generator, so that a core
can stop at a cross-core wait (`CrossCoreWaitFlag`) and let the others run.
"""
from __future__ import annotations

import dataclasses
import keyword
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath


class CxxError(ValueError):
    """Code outside the subset, with the file and line."""


SCALARS = {"bool", "int", "unsigned", "float", "double", "half", "bfloat16_t", "int8_t", "uint8_t",
           "int16_t", "uint16_t", "int32_t", "uint32_t", "int64_t", "uint64_t", "size_t",
           "event_t", "TEventID", "GM_ADDR", "int4b_t", "void"}
QUALIFIERS = {"const", "volatile", "static", "constexpr", "inline", "__aicore__", "__global__",
              "__gm__", "__restrict", "__restrict__", "typename", "explicit"}
# runtime names that take template arguments (AscendC's), besides the sources' own templates
RUNTIME_TEMPLATES = {"LocalTensor", "GlobalTensor", "TBuf", "DataCopyPadExtParams", "MatmulType",
                     "MatmulImpl", "Get", "SetFlag", "WaitFlag", "AllocEventID", "ReleaseEventID",
                     "CrossCoreSetFlag", "CrossCoreWaitFlag", "PipeBarrier", "ReinterpretCast",
                     "static_cast", "reinterpret_cast", "Cast", "Abs", "Muls", "Adds", "Mul",
                     "Div", "Add", "Sub", "Max", "Min", "Axpy", "Duplicate", "ReduceMax",
                     "DataCopy", "DataCopyPad", "DataCacheCleanAndInvalid", "GetValue",
                     "SetValue"}
# runtime calls that can block the core (generators in runtime.py)
BLOCKING = {"CrossCoreWaitFlag"}
SKIPPED_MACROS = re.compile(r"ASCENDC_TPL_\w+|KERNEL_TASK_TYPE_DEFAULT")
BINARY = [  # C precedence, loosest first
    ("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", "<=", ">", ">="),
    ("<<", ">>"), ("+", "-"), ("*", "/", "%")]
PY_BINARY = {"||": "or", "&&": "and"}
ASSIGN_OPS = {"=", "+=", "-=", "*=", "/=", "%=", "<<=", ">>=", "&=", "|=", "^="}
TOKEN = re.compile(r"""
    (?P<ws>\s+) | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[fFuUlL]*|0[xX][0-9a-fA-F]+[uUlL]*)
  | (?P<str>"(?:\\.|[^"\\])*") | (?P<id>[A-Za-z_]\w*)
  | (?P<op>::|->|\+\+|--|<<=|>>=|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^]=
           |[{}()\[\];,.<>=+\-*/%!&|^~?:\#])
""", re.X | re.S)


@dataclass(frozen=True)
class Tok:
    kind: str
    text: str
    where: str


@dataclass
class CType:
    name: str                     # base name: a scalar, a class, a runtime type (last component)
    qualified: str                # as written, `::` joined
    targs: list = field(default_factory=list)   # Python sources of the template arguments
    pointer: bool = False
    reference: bool = False

    @property
    def scalar(self) -> bool:
        return self.name in SCALARS and not self.pointer


def tokenize(text: str, filename: str, line: int = 1) -> list[Tok]:
    out, pos = [], 0
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m:
            raise CxxError(f"{filename}:{line}: unexpected character {text[pos]!r}")
        kind = m.lastgroup
        if kind not in ("ws", "comment"):
            out.append(Tok(kind, m.group(), f"{filename}:{line}"))
        line += m.group().count("\n")
        pos = m.end()
    return out


def preprocess(files: dict[str, str], entry: str) -> tuple[list[Tok], dict[str, list[Tok]]]:
    """Tokens of `entry` with its project-relative includes expanded (each file once), and the
    object-like macros defined. Includes that are not in `files` are the AscendC API: skipped."""
    seen: set[str] = set()
    macros: dict[str, list[Tok]] = {}

    def expand(path: str) -> list[Tok]:
        if path in seen:
            return []
        seen.add(path)
        out: list[Tok] = []
        # block comments become blank lines, so that line numbers stay right
        text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group().count("\n"), files[path],
                      flags=re.S)
        for number, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            if not stripped.startswith("#"):
                out += tokenize(line, path, number)
                continue
            directive = stripped[1:].split(None, 1)
            word = directive[0] if directive else ""
            rest = directive[1] if len(directive) > 1 else ""
            if word == "include":
                m = re.match(r'"([^"]+)"', rest)
                if m:
                    target = str(PurePosixPath(path).parent / m.group(1))
                    target = _normalise(target)
                    if target in files:
                        out += expand(target)
            elif word == "define":
                m = re.match(r"(\w+)(.*)", rest)
                if not m or m.group(2).startswith("("):
                    raise CxxError(f"{path}:{number}: only object-like #define is emulated")
                macros[m.group(1)] = tokenize(m.group(2), path, number)
            elif word != "pragma":
                raise CxxError(f"{path}:{number}: #{word} is outside the emulated subset")
        return out

    return expand(entry), macros


def _normalise(path: str) -> str:
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            parts.pop()
        elif part not in (".", ""):
            parts.append(part)
    return "/".join(parts)


def py_name(name: str) -> str:
    return name + "_" if keyword.iskeyword(name) or name in ("self", "np") else name


class Scope:
    def __init__(self, parent: "Scope | None" = None):
        self.parent, self.names = parent, {}

    def lookup(self, name: str):
        scope = self
        while scope is not None:
            if name in scope.names:
                return scope.names[name]
            scope = scope.parent
        return None


@dataclass
class ClassInfo:
    name: str
    tparams: list[str]
    members: dict = field(default_factory=dict)      # name -> CType | "method" | "alias"


class Translator:
    """Parses the token stream and writes the Python module."""

    def __init__(self, tokens: list[Tok], macros: dict[str, list[Tok]]):
        self.toks, self.i = tokens, 0
        self.macros = macros
        self.lines: list[str] = []
        self.classes: dict[str, ClassInfo] = {}
        self.functions: dict[str, CType] = {}       # user free functions -> return type
        self.globals: dict[str, CType] = {}
        self.templates = set(RUNTIME_TEMPLATES) | self._template_names()
        self.cls: ClassInfo | None = None
        self.scope: Scope | None = None
        self.return_type: CType | None = None
        self.fn_tparams: list[str] = []

    # --- token helpers ---------------------------------------------------------------------
    def _template_names(self) -> set[str]:
        """The names the sources declare as templates: the last name before the `(`, `{` or `;`
        that follows each `template <...>` header."""
        names, toks = set(), self.toks
        for j, t in enumerate(toks):
            if t.text != "template":
                continue
            depth, k = 0, j + 1
            while k < len(toks):
                depth += {"<": 1, ">": -1}.get(toks[k].text, 0)
                k += 1
                if depth == 0:
                    break
            last = None
            while k < len(toks) and toks[k].text not in ("(", "{", ";"):
                if toks[k].kind == "id" and toks[k].text not in QUALIFIERS | SCALARS | {
                        "class", "struct"}:
                    last = toks[k].text
                k += 1
            if last is not None:
                names.add(last)
        return names

    def peek(self, k: int = 0) -> Tok:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else Tok("eof", "", "end of input")

    def next(self) -> Tok:
        t = self.peek()
        self.i += 1
        return t

    def expect(self, text: str) -> Tok:
        t = self.next()
        if t.text != text:
            raise CxxError(f"{t.where}: expected {text!r}, found {t.text!r}")
        return t

    def accept(self, text: str) -> bool:
        if self.peek().text == text:
            self.i += 1
            return True
        return False

    def fail(self, what: str) -> None:
        raise CxxError(f"{self.peek().where}: {what} (found {self.peek().text!r}); "
                       "outside the emulated C++ subset")

    def skip_balanced(self) -> None:
        """From an opening bracket to its closing one."""
        pairs = {"(": ")", "{": "}", "[": "]"}
        close, depth = pairs[self.next().text], 1
        opening = {v: k for k, v in pairs.items()}[close]
        while depth:
            t = self.next()
            if t.kind == "eof":
                self.fail("unbalanced brackets")
            depth += (t.text == opening) - (t.text == close)

    # --- types -------------------------------------------------------------------------------
    def parse_qualified(self) -> list[str]:
        parts = [self.next().text]
        while self.peek().text == "::" and self.peek(1).kind == "id":
            self.i += 1
            parts.append(self.next().text)
        return parts

    def try_type(self) -> CType | None:
        """A type at the cursor (consumed), or None (cursor unchanged)."""
        start = self.i
        while self.peek().text in QUALIFIERS:
            self.i += 1
        if self.peek().kind != "id" or self.peek().text in ("return", "if", "for", "else",
                                                             "while", "template", "using"):
            self.i = start
            return None
        if self.peek().text == "unsigned" and self.peek(1).text in ("int", "long"):
            self.i += 1
        parts = self.parse_qualified()
        ctype = CType(parts[-1], "::".join(parts))
        if self.peek().text == "<" and parts[-1] in self.templates:
            ctype.targs = self.template_args()
        while self.peek().text in ("*", "&", "const", "__restrict", "__restrict__"):
            t = self.next().text
            ctype.pointer |= t == "*"
            ctype.reference |= t == "&"
        return ctype

    def template_args(self) -> list[str]:
        self.expect("<")
        args: list[str] = []
        while not self.accept(">"):
            start = self.i
            ctype = self.try_type()
            if ctype is not None and self.peek().text in (",", ">") and (
                    ctype.name in SCALARS or ctype.name in self.classes or ctype.targs):
                args.append(self.type_value(ctype))
            else:
                self.i = start
                args.append(self.expression(stop_gt=True))
            self.accept(",")
        return args

    def type_value(self, ctype: CType) -> str:
        """A type used as a value (a template argument or an alias): its name for a scalar, else
        the class (the sources' own, or the runtime's) built with its template arguments."""
        if ctype.name in SCALARS:
            return repr(ctype.name)
        return f"{self.name_ref(ctype.qualified)}(_t=({''.join(a + ', ' for a in ctype.targs)}))"

    def default_value(self, ctype: CType, dims: list[str]) -> str:
        if ctype.pointer:
            value = "None"
        elif ctype.scalar:
            value = f"_conv({ctype.name!r}, 0)"
        else:
            value = self.type_value(ctype)
        for dim in reversed(dims):
            value = f"[{value} for _ in range({dim})]"
        return value

    def is_user_class(self, ctype: CType | None) -> bool:
        return ctype is not None and not isinstance(ctype, str) and ctype.name in self.classes

    # --- names --------------------------------------------------------------------------------
    def name_ref(self, qualified: str) -> str:
        parts = qualified.split("::")
        head = parts[0]
        if len(parts) == 1:
            if self.scope is not None and self.scope.lookup(head) is not None:
                return py_name(head)
            if self.cls is not None and (head in self.cls.members or head in self.cls.tparams):
                return f"self.{head}"
            if head in self.fn_tparams:
                return py_name(head)
            if head in self.macros:
                return f"({self.macro_value(head)})"
            if head in ("ASCEND_IS_AIC", "ASCEND_IS_AIV"):
                return f"_rt.{head.lower()}()"
        return ".".join(py_name(p) for p in parts)

    def macro_value(self, name: str) -> str:
        saved = self.toks, self.i
        self.toks, self.i = self.macros[name] + [Tok("eof", "", "macro")], 0
        try:
            return self.expression()
        finally:
            self.toks, self.i = saved

    def type_of(self, qualified: str) -> CType | None:
        head = qualified.split("::")[0]
        if self.scope is not None and self.scope.lookup(head) is not None:
            return self.scope.lookup(head)
        if self.cls is not None and isinstance(self.cls.members.get(head), CType):
            return self.cls.members[head]
        return self.globals.get(head)

    # --- expressions --------------------------------------------------------------------------
    def expression(self, stop_gt: bool = False) -> str:
        return self.ternary(stop_gt)

    def ternary(self, stop_gt: bool) -> str:
        cond = self.binary(0, stop_gt)
        if self.accept("?"):
            a = self.ternary(stop_gt)
            self.expect(":")
            b = self.ternary(stop_gt)
            return f"({a} if {cond} else {b})"
        return cond

    def binary(self, level: int, stop_gt: bool) -> str:
        if level == len(BINARY):
            return self.unary()
        left = self.binary(level + 1, stop_gt)
        while self.peek().text in BINARY[level] and not (stop_gt and self.peek().text == ">"):
            op = self.next().text
            right = self.binary(level + 1, stop_gt)
            if op == "/":
                left = f"_div({left}, {right})"
            elif op == "%":
                left = f"_mod({left}, {right})"
            else:
                left = f"({left} {PY_BINARY.get(op, op)} {right})"
        return left

    def unary(self) -> str:
        t = self.peek().text
        if t in ("!", "-", "+", "~"):
            self.i += 1
            operand = self.unary()
            return f"(not {operand})" if t == "!" else f"({t}{operand})"
        if t in ("&", "*"):             # address-of / dereference: Python references already
            self.i += 1
            return self.unary()
        if t in ("++", "--"):
            self.fail("increment inside an expression")
        return self.postfix(self.primary())

    def arguments(self, opening: str = "(") -> list[str]:
        """The comma-separated expressions between `opening` and its closing bracket."""
        closing = {"(": ")", "{": "}"}[opening]
        self.expect(opening)
        args = []
        while not self.accept(closing):
            args.append(self.expression())
            self.accept(",")
        return args

    def primary(self) -> tuple[str, CType | None, str | None]:
        """(Python source, its static C type where known, the callee's name where a call)"""
        t = self.next()
        if t.kind == "num":
            return self.number(t.text), None, None
        if t.text == "(":
            inner = self.expression()
            self.expect(")")
            return f"({inner})", None, None
        if t.text in ("true", "false", "nullptr", "this"):
            return {"true": "True", "false": "False", "nullptr": "None",
                    "this": "self"}[t.text], None, None
        if t.text == "sizeof":
            self.expect("(")
            ctype = self.try_type()
            if ctype is None:
                self.fail("sizeof of an expression")
            self.expect(")")
            return f"_sizeof({ctype.name!r})", None, None
        if t.text in ("static_cast", "reinterpret_cast"):
            self.expect("<")
            ctype = self.try_type()
            self.expect(">")
            self.expect("(")
            inner = self.expression()
            self.expect(")")
            if t.text == "reinterpret_cast":
                return inner, ctype, None
            return (f"_conv({ctype.name!r}, {inner})" if ctype.scalar else inner), ctype, None
        if t.kind != "id":
            raise CxxError(f"{t.where}: unexpected {t.text!r} in an expression")
        self.i -= 1
        parts = self.parse_qualified()
        qualified = "::".join(parts)
        targs = self.template_args() if (self.peek().text == "<"
                                         and parts[-1] in self.templates) else None
        ref = self.name_ref(qualified)
        if self.peek().text == "(":
            args = self.arguments()
            method = len(parts) == 1 and self.cls is not None and \
                self.cls.members.get(parts[0]) == "method"
            user = method or (len(parts) == 1 and parts[0] in self.functions)
            return self.call(ref, parts[-1], args, targs, user=user), \
                self.functions.get(parts[-1]), parts[-1]
        if self.peek().text == "{" and (targs is not None or parts[-1] in self.classes
                                        or parts[0] == "AscendC"):
            args = self.arguments("{")
            return self.call(ref, parts[-1], args, targs or [], user=False), None, None
        return ref, self.type_of(qualified), None

    def call(self, ref: str, name: str, args: list[str], targs: list[str] | None,
             user: bool) -> str:
        if targs:
            args = args + [f"_t=({''.join(a + ', ' for a in targs)})"]
        source = f"{ref}({', '.join(args)})"
        if user or name in BLOCKING:
            return f"(yield from {source})"
        return source

    def postfix(self, prim) -> str:
        source, ctype, _ = prim
        while True:
            t = self.peek().text
            if t in (".", "->"):
                self.i += 1
                member = self.next().text
                targs = self.template_args() if (self.peek().text == "<"
                                                 and member in self.templates) else None
                if self.peek().text == "(":
                    args = self.arguments()
                    user = self.is_user_class(ctype)
                    source = self.call(f"{source}.{py_name(member)}", member, args, targs, user)
                    ctype = None
                else:
                    source = f"{source}.{py_name(member)}"
                    ctype = self.member_type(ctype, member)
            elif t == "[":
                self.i += 1
                index = self.expression()
                self.expect("]")
                source = f"{source}[{index}]"
                ctype = ctype if ctype is not None and not ctype.scalar else None
            elif t in ("++", "--"):
                self.fail("increment inside an expression")
            else:
                return source

    def member_type(self, ctype: CType | None, member: str) -> CType | None:
        if ctype is None or ctype.name not in self.classes:
            return None
        found = self.classes[ctype.name].members.get(member)
        return found if isinstance(found, CType) else None

    @staticmethod
    def number(text: str) -> str:
        body = text.rstrip("uUlL")
        if body.lower().startswith("0x"):
            return str(int(body, 16))
        if body[-1] in "fF" and not body.lower().startswith("0x"):
            return f"_f32({body[:-1]})"
        if any(c in body for c in ".eE"):
            return body
        return str(int(body))

    # --- statements ---------------------------------------------------------------------------
    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def block(self, depth: int) -> None:
        """A brace block or a single statement, as the body at `depth`."""
        start = len(self.lines)
        self.scope = Scope(self.scope)
        if self.accept("{"):
            while not self.accept("}"):
                self.statement(depth)
        else:
            self.statement(depth)
        self.scope = self.scope.parent
        if len(self.lines) == start:
            self.emit(depth, "pass")

    def statement(self, depth: int) -> None:
        t = self.peek()
        if t.text == ";":
            self.i += 1
            self.emit(depth, "pass")
        elif t.text == "{":
            self.i += 1
            self.scope = Scope(self.scope)
            while not self.accept("}"):
                self.statement(depth)
            self.scope = self.scope.parent
        elif t.text == "if":
            self.if_statement(depth, "if")
        elif t.text == "for":
            self.for_statement(depth)
        elif t.text == "return":
            self.i += 1
            if self.accept(";"):
                self.emit(depth, "return")
            else:
                value = self.expression()
                self.expect(";")
                ret = self.return_type
                self.emit(depth, f"return {self.convert(ret, value)}")
        elif t.text in ("while", "do", "switch", "goto", "continue", "break"):
            self.fail(f"'{t.text}'")
        elif t.text == "GET_TILING_DATA_WITH_STRUCT":
            self.i += 1
            self.expect("(")
            struct = self.next().text
            self.expect(",")
            name = self.next().text
            self.expect(",")
            arg = self.expression()
            self.expect(")")
            self.expect(";")
            self.scope.names[name] = CType(struct, struct)
            self.emit(depth, f"{py_name(name)} = _rt.tiling_data({self.name_ref(struct)}, {arg})")
        elif t.text in ("++", "--"):
            self.i += 1
            target, ctype = self.lvalue()
            self.expect(";")
            self.emit(depth, f"{target} = {self.convert(ctype, f'({target} {t.text[0]} 1)')}")
        else:
            start = self.i
            ctype = self.try_type()
            if ctype is not None and self.peek().kind == "id":
                self.declaration(depth, ctype)
            else:
                self.i = start
                self.expression_statement(depth)

    def convert(self, ctype: CType | None, value: str) -> str:
        if ctype is not None and ctype.scalar and ctype.name != "void":
            return f"_conv({ctype.name!r}, {value})"
        return value

    def declarators(self, ctype: CType, record) -> list[tuple[str, str]]:
        """`name[dims] init, name2 ... ;` after a type: (name, its Python value) each; `record`
        is told each name and type before its initialiser is read."""
        out = []
        while True:
            name = self.next().text
            dims = []
            while self.accept("["):
                dims.append(self.expression())
                self.expect("]")
            declared = dataclasses.replace(ctype)
            record(name, declared)
            out.append((name, self.initialiser(declared, dims)))
            if not self.accept(","):
                break
        self.expect(";")
        return out

    def declaration(self, depth: int, ctype: CType) -> None:
        for name, value in self.declarators(ctype, self.scope.names.__setitem__):
            self.emit(depth, f"{py_name(name)} = {value}")

    def initialiser(self, ctype: CType, dims: list[str]) -> str:
        """What a declarator is set to: `= value`, `{args}`, `(args)` or the type's default."""
        if self.accept("="):
            if self.peek().text == "{":
                values = self.arguments("{")
                if dims:
                    return f"[{', '.join(self.convert(ctype, v) for v in values)}]"
                return self.construct(ctype, values)
            value = self.expression()
            if dims:
                self.fail("an array initialised from an expression")
            if ctype.scalar or ctype.pointer or ctype.reference:
                return self.convert(ctype, value)
            return f"_copy({value})"
        if self.peek().text in ("{", "("):
            values = self.arguments(self.peek().text)
            return self.construct(ctype, values)
        return self.default_value(ctype, dims)

    def construct(self, ctype: CType, values: list[str]) -> str:
        if ctype.scalar:
            return self.convert(ctype, values[0] if values else "0")
        targs = f"_t=({''.join(a + ', ' for a in ctype.targs)})"
        return f"{self.name_ref(ctype.qualified)}({', '.join(values + [targs])})"

    def lvalue(self) -> tuple[str, CType | None]:
        prim = self.primary()
        source = self.postfix(prim)
        return source, self.lvalue_type(source, prim)

    def lvalue_type(self, source: str, prim) -> CType | None:
        ref, ctype, _ = prim
        if source == ref:
            return ctype
        if source.startswith(ref + "[") and ctype is not None:
            return CType(ctype.name, ctype.qualified)    # an element of a declared array
        return None

    def expression_statement(self, depth: int) -> None:
        prim = self.primary()
        target = self.postfix(prim)
        op = self.peek().text
        if op in ASSIGN_OPS:
            self.i += 1
            value = self.expression()
            self.expect(";")
            ctype = self.lvalue_type(target, prim)
            if op != "=":
                binop = op[:-1]
                value = {"/": f"_div({target}, {value})", "%": f"_mod({target}, {value})"}.get(
                    binop, f"({target} {binop} {value})")
            self.emit(depth, f"{target} = {self.convert(ctype, value)}")
            return
        if op in ("++", "--"):
            self.i += 1
            self.expect(";")
            ctype = self.lvalue_type(target, prim)
            self.emit(depth, f"{target} = {self.convert(ctype, f'({target} {op[0]} 1)')}")
            return
        self.expect(";")
        self.emit(depth, target)

    def if_statement(self, depth: int, word: str) -> None:
        self.expect("if")
        self.accept("constexpr")
        if self.peek().text in ("ASCEND_IS_AIC", "ASCEND_IS_AIV"):
            cond = self.name_ref(self.next().text)
        else:
            self.expect("(")
            cond = self.expression()
            self.expect(")")
        self.emit(depth, f"{word} {cond}:")
        self.block(depth + 1)
        if self.accept("else"):
            if self.peek().text == "if":
                self.if_statement(depth, "elif")
            else:
                self.emit(depth, "else:")
                self.block(depth + 1)

    def for_statement(self, depth: int) -> None:
        self.expect("for")
        self.expect("(")
        self.scope = Scope(self.scope)
        self.statement(depth)                       # the init: a declaration or an expression
        cond = "True" if self.peek().text == ";" else self.expression()
        self.expect(";")
        step_start = self.i
        depth_paren = 0
        while not (self.peek().text == ")" and depth_paren == 0):
            depth_paren += (self.peek().text == "(") - (self.peek().text == ")")
            self.i += 1
        step_toks = self.toks[step_start:self.i] + [Tok("op", ";", self.peek().where)]
        self.expect(")")
        self.emit(depth, f"while {cond}:")
        self.block(depth + 1)
        saved = self.toks, self.i
        self.toks, self.i = step_toks + [Tok("eof", "", "for step")], 0
        self.statement(depth + 1)
        self.toks, self.i = saved
        self.scope = self.scope.parent

    # --- definitions --------------------------------------------------------------------------
    def template_header(self) -> list[str]:
        """`template <int A, class B>` -> ["A", "B"]."""
        self.expect("template")
        self.expect("<")
        params = []
        while not self.accept(">"):
            ctype = self.try_type()
            if ctype is None:
                self.fail("a template parameter")
            params.append(self.next().text if self.peek().kind == "id" else ctype.name)
            self.accept(",")
        return params

    def function(self, depth: int, ret: CType, name: str, tparams: list[str],
                 method: bool) -> None:
        self.expect("(")
        params: list[tuple[str, CType]] = []
        while not self.accept(")"):
            ctype = self.try_type()
            if ctype is None:
                self.fail("a parameter")
            pname = self.next().text if self.peek().kind == "id" else f"_unused{len(params)}"
            params.append((pname, ctype))
            if self.accept("="):
                self.expression()
            self.accept(",")
        self.accept("const")
        names = (["self"] if method else []) + [py_name(p) for p, _ in params]
        if tparams and not method:
            names.append("_t=()")
        self.emit(depth, f"def {py_name(name)}({', '.join(names)}):")
        self.emit(depth + 1, "if False:")
        self.emit(depth + 2, "yield")
        for index, tparam in enumerate(tparams if not method else []):
            self.emit(depth + 1, f"{py_name(tparam)} = _t[{index}]")
        self.scope = Scope(None)
        self.fn_tparams = [] if method else tparams
        for pname, ctype in params:
            self.scope.names[pname] = ctype
            if ctype.scalar and not ctype.reference:
                self.emit(depth + 1, f"{py_name(pname)} = {self.convert(ctype, py_name(pname))}")
        self.return_type = ret
        self.expect("{")
        while not self.accept("}"):
            self.statement(depth + 1)
        self.scope, self.fn_tparams = None, []

    def class_definition(self, tparams: list[str]) -> None:
        self.next()                                  # class | struct
        name = self.next().text
        if self.accept(";"):
            return                                   # a declaration
        self.accept("final")
        if self.peek().text == ":":
            self.fail("a base class")
        info = ClassInfo(name, tparams)
        self.classes[name] = info
        self.cls = info
        self.expect("{")
        fields, methods = self.class_members(info)
        self.emit(0, f"class {name}:")
        for alias, source in info.members.items():
            if isinstance(source, str) and source.startswith("alias:"):
                self.emit(1, f"{alias} = {source[6:]}")
        self.emit(1, "def __init__(self, _t=()):")
        for index, tparam in enumerate(tparams):
            self.emit(2, f"self.{tparam} = _t[{index}]")
        for fname, value in fields:
            self.emit(2, f"self.{py_name(fname)} = {value}")
        self.emit(2, "pass")
        end = self.i
        for start, ret, mname in methods:
            self.i = start
            self.function(1, ret, mname, [], method=True)
        self.i = end
        self.expect(";")
        self.cls = None

    def class_members(self, info: ClassInfo):
        """Records the members; returns (field initialisers, method positions)."""
        fields, methods = [], []
        while not self.accept("}"):
            t = self.peek().text
            if t in ("public", "private", "protected"):
                self.i += 1
                self.expect(":")
                continue
            if t == "using":
                self.i += 1
                alias = self.next().text
                self.expect("=")
                ctype = self.try_type()
                self.expect(";")
                info.members[alias] = "alias:" + self.type_value(ctype)
                continue
            if t == "template":
                self.fail("a member template")
            ctype = self.try_type()
            if ctype is None:
                self.fail("a member declaration")
            if self.peek().text == "(":
                self.fail("a constructor")
            if self.peek(1).text == "(":
                name = self.next().text
                info.members[name] = "method"
                methods.append((self.i, ctype, name))
                self.skip_balanced()
                self.accept("const")
                self.skip_balanced()
                continue
            self.scope = None
            fields += self.declarators(ctype, info.members.__setitem__)
        return fields, methods

    def top_level(self) -> None:
        tparams: list[str] = []
        if self.peek().text == "template":
            tparams = self.template_header()
        t = self.peek()
        if t.text in ("class", "struct"):
            self.class_definition(tparams)
            return
        if t.kind == "id" and SKIPPED_MACROS.fullmatch(t.text):
            self.i += 1
            self.skip_balanced()
            self.accept(";")
            return
        if t.text == "namespace":
            self.fail("a namespace")
        ctype = self.try_type()
        if ctype is None:
            self.fail("a declaration")
        if self.peek(1).text == "(":
            name = self.next().text
            self.functions[name] = ctype
            self.function(0, ctype, name, tparams, method=False)
            return
        for name, value in self.declarators(ctype, self.globals.__setitem__):
            self.emit(0, f"{py_name(name)} = {value}")

    def translate(self) -> str:
        for name in self.macros:
            self.globals.setdefault(name, None)
        self.emit(0, "# translated from the emitted AscendC sources by moegen's emulator")
        for name in self.macros:
            self.emit(0, f"{name} = {self.macro_value(name)}")
        while self.peek().kind != "eof":
            self.top_level()
        return "\n".join(self.lines) + "\n"


def translate(files: dict[str, str], entry: str) -> str:
    """The Python source of the kernel `entry` (a path in `files`) and everything it includes."""
    tokens, macros = preprocess(files, entry)
    return Translator(tokens + [Tok("eof", "", "end of input")], macros).translate()
