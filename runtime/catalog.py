"""The spec catalog: the specs shipped in specs/ (installed as optgen.specs)."""
from __future__ import annotations

import os


def specs_dir() -> str:
    import optgen.specs
    return os.path.dirname(optgen.specs.__file__)


def list_specs() -> dict[str, str]:
    """Spec name -> file, for every spec shipped with optgen."""
    folder = specs_dir()
    return {f[:-3]: os.path.join(folder, f) for f in sorted(os.listdir(folder))
            if f.endswith(".py") and not f.startswith("_")}


def resolve(spec: str | os.PathLike) -> str:
    """A catalog name (``"adam"``) or a path to a spec file -> the spec file's path."""
    text = os.fspath(spec)
    if text.endswith(".py") or os.sep in text:
        if not os.path.isfile(text):
            raise FileNotFoundError(f"spec file {text!r} does not exist")
        return os.path.abspath(text)
    known = list_specs()
    if text not in known:
        raise ValueError(f"unknown optimizer {text!r}; known: {', '.join(known)} "
                         "(or pass the path of a spec file)")
    return known[text]
