"""The spec catalog: the specs shipped in specs/ (installed as optgen.specs), plus the
specs a trainer registers at run time with ``optgen.register``."""
from __future__ import annotations

import importlib.util
import os
import re

_registered: dict[str, str] = {}
# the global-norm pass (clip_global_norm, the non-finite check): its spec file in specs/,
# and the folder inside an artifact built with --out that ships its kernels
SQUARES_SPEC = "_sum_of_squares.py"
SHIPPED_SQUARES = "_sum_of_squares"


def specs_dir() -> str:
    # found, not imported: the core imports nothing of optgen outside itself
    spec = importlib.util.find_spec("optgen.specs")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the package optgen.specs is not installed")
    return list(spec.submodule_search_locations)[0]


def list_specs() -> dict[str, str]:
    """Spec name -> file, for every spec shipped with optgen or registered."""
    folder = specs_dir()
    shipped = {f[:-3]: os.path.join(folder, f) for f in sorted(os.listdir(folder))
               if f.endswith(".py") and not f.startswith("_")}
    return {**shipped, **_registered}


def register(name: str, spec: str | os.PathLike, *, overwrite: bool = False) -> str:
    """Make ``optgen.create(name, ...)`` use the spec file ``spec``; returns its path.

    Registering a name that is taken (shipped or registered) needs ``overwrite=True``."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"register: name must be an identifier, got {name!r}")
    path = os.fspath(spec)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"register: spec file {path!r} does not exist")
    if name in list_specs() and not overwrite:
        raise ValueError(f"register: {name!r} is already a known optimizer "
                         f"({list_specs()[name]}); pass overwrite=True to replace it")
    _registered[name] = os.path.abspath(path)
    return _registered[name]


def resolve(spec: str | os.PathLike) -> str:
    """A catalog name (``"adam"``) or a path to a spec file -> the spec file's path."""
    text = os.fspath(spec)
    if text in _registered:
        return _registered[text]
    if text.endswith(".py") or os.sep in text:
        if not os.path.isfile(text):
            raise FileNotFoundError(f"spec file {text!r} does not exist")
        return os.path.abspath(text)
    known = list_specs()
    if text not in known:
        raise ValueError(f"unknown optimizer {text!r}; known: {', '.join(known)} "
                         "(or pass the path of a spec file, or optgen.register one)")
    return known[text]
