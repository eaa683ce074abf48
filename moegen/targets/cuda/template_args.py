"""C++ template arguments written for people: each named by its parameter, wrapped."""
from __future__ import annotations


def template_args(params: list[tuple], indent: int = 6, width: int = 100) -> str:
    """`/*NAME=*/value` for each (NAME, value) or (NAME, value, default) of `params`, in order,
    on lines of at most `width` columns indented by `indent`, after a line break; the defaulted
    ones are left out from the first whose value and every later one's equal their defaults
    (the header's template then supplies them)."""
    last = len(params)
    while last and len(params[last - 1]) == 3 and params[last - 1][1] == params[last - 1][2]:
        last -= 1
    items = [f"/*{p[0]}=*/{_cpp(p[1])}" for p in params[:last]]
    lines, line = [], ""
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if line and indent + len(line) + 1 + len(piece) > width:
            lines.append(line)
            line = piece
        else:
            line = f"{line} {piece}" if line else piece
    lines.append(line)
    return "".join(f"\n{' ' * indent}{text}" for text in lines)


def _cpp(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
