"""The Jinja2 environment every template is rendered with (strict: a missing name fails)."""
from __future__ import annotations

from functools import lru_cache

import jinja2

from .resources import data_dir


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              trim_blocks=True, lstrip_blocks=True, autoescape=False)


def render(name: str, **context) -> str:
    return environment().get_template(name).render(**context)
