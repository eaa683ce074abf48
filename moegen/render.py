"""The Jinja2 environment every template is rendered with (strict: a missing name fails)."""
from __future__ import annotations

import textwrap
from functools import lru_cache

import jinja2

from .resources import data_dir


def line_comment(text: str, width: int = 100) -> str:
    """Each line of `text` as `// ` comment lines of at most `width` columns (a word longer than
    a line keeps its own), ending in a newline: `{% filter line_comment %}` in a template."""
    lines = []
    for paragraph in text.strip("\n").split("\n"):
        lines += [f"// {line}" for line in textwrap.wrap(
            paragraph, width - 3, break_long_words=False, break_on_hyphens=False)] or ["//"]
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["line_comment"] = line_comment
    return env


def render(name: str, **context) -> str:
    return environment().get_template(name).render(**context)
