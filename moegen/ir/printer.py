"""The MLIR-like textual form. One op per line; a region op opens a block on the same line:

    module @name attributes {key = value} {
      func @f(%x: tensor<?x2048xf16>) -> (tensor<?x2048xf16>) {
        %a, %b = dialect.op(%x) {attr = 8, flag = true} : (tensor<..>) -> (tensor<..>, tensor<..>)
        %acc = msd.group_loop(%init) {groups = 64} : (tensor<..>) -> (tensor<..>) {
        ^body(%g: index, %acc_in: tensor<..>):
          msd.yield(%next) : (tensor<..>) -> ()
        }
        return(%out) : (tensor<..>) -> ()
      }
    }

Attribute values: integers, floats (always with '.' or an exponent), true/false, "strings",
[lists], {nested = dicts}, and symbolic dimensions (``K``, ``?*K+E*B``).
"""
from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from .types import Dim

if TYPE_CHECKING:       # (annotations only: core prints a module through this file)
    from .core import Block, Function, Module, Op

_BARE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


def format_attr(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Dim):
        return str(value.value) if value.is_static else str(value)
    if isinstance(value, list):
        return "[" + ", ".join(format_attr(v) for v in value) + "]"
    if isinstance(value, dict):
        return format_attrs(value)
    raise TypeError(f"cannot print attribute value {value!r}")


def format_attrs(attrs: dict) -> str:
    return "{" + ", ".join(f"{k} = {format_attr(v)}" for k, v in attrs.items()) + "}"


def format_symbol(name: str) -> str:
    return "@" + (name if _BARE_NAME.match(name) else json.dumps(name))


def _types(values) -> str:
    return "(" + ", ".join(str(v.type) for v in values) + ")"


def print_op(op: Op, indent: str, out: list[str]) -> None:
    head = ""
    if op.results:
        head = ", ".join(f"%{r.name}" for r in op.results) + " = "
    text = f"{indent}{head}{op.NAME}(" + ", ".join(f"%{v.name}" for v in op.operands) + ")"
    if op.attrs:
        text += " " + format_attrs(op.attrs)
    text += f" : {_types(op.operands)} -> {_types(op.results)}"
    if op.region is None:
        out.append(text)
        return
    out.append(text + " {")
    print_block(op.region, indent, out, label="body")
    out.append(indent + "}")


def print_block(block: Block, indent: str, out: list[str], label: str | None) -> None:
    if label is not None:
        args = ", ".join(f"%{a.name}: {a.type}" for a in block.args)
        out.append(f"{indent}^{label}({args}):")
    for op in block.ops:
        print_op(op, indent + "  ", out)


def print_function(fn: Function, indent: str = "  ") -> list[str]:
    args = ", ".join(f"%{a.name}: {a.type}" for a in fn.args)
    results = ", ".join(str(t) for t in fn.result_types)
    out = [f"{indent}func {format_symbol(fn.name)}({args}) -> ({results}) {{"]
    print_block(fn.body, indent, out, label=None)
    out.append(indent + "}")
    return out


def print_module(module: Module) -> str:
    head = f"module {format_symbol(module.name)}"
    if module.attrs:
        head += " attributes " + format_attrs(module.attrs)
    lines = [head + " {"]
    for fn in module.functions:
        lines += print_function(fn)
    lines.append("}")
    return "\n".join(lines) + "\n"
