"""jinja2 access to templates/ (installed as optgen.templates)."""
from __future__ import annotations

import functools
import os

import jinja2

from .scratch import LANE


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    import optgen.templates as pkg
    folder = os.path.dirname(pkg.__file__)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(folder), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    env.globals["lane"] = LANE   # the scratch buffers' lane index (optgen.compiler.scratch)
    return env


def render(name: str, **context) -> str:
    return environment().get_template(name).render(**context)
