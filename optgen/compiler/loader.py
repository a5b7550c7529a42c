"""Stage 1 — load: run a spec file and return its ``Spec``.

Python errors raised while the spec runs (syntax errors, undefined names, ...) become a
``SpecError`` pointing at the spec's own line. ``base_spec`` (spec files import it from
optgen.dsl) loads a catalog spec that another one builds on.
"""
from __future__ import annotations

import os
import traceback
import types

from ..declarations import Spec
from ..errors import SpecError
from ..core import catalog


def spec_line_error(exc: BaseException, path: str) -> SpecError:
    """Wrap an exception raised by spec code, located at the deepest spec-file frame."""
    if isinstance(exc, SpecError):
        return exc
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if os.path.abspath(frame.f_code.co_filename) == os.path.abspath(path):
            line = lineno
    kind = {"NameError": "undefined name", "AttributeError": "undefined attribute"}.get(
        type(exc).__name__, type(exc).__name__)
    hint = {"NameError": "define it above this line, or declare it with spec.hyper(), "
                         "spec.state() or spec.flag()",
            "AttributeError": "check the spelling (optgen.dsl lists what a spec can use)"}.get(
        type(exc).__name__, "the spec's Python code raised this at that line")
    return SpecError(f"{kind}: {exc}", file=path, line=line, hint=hint)


def load_spec(path: str, base: str | None = None) -> Spec:
    """The spec a file defines; with ``base``, the file's ``wrap(base_spec)`` applied to
    the catalog spec ``base`` (wrappers such as LARS)."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except OSError as e:
        raise SpecError(f"cannot read spec: {e.strerror}", file=path,
                        hint="pass a spec file or a catalog name (optgen list)") from None
    try:
        code = compile(source, path, "exec")
    except SyntaxError as e:
        raise SpecError(f"syntax error: {e.msg}", file=path, line=e.lineno,
                        hint="a spec is a Python file; fix the syntax there") from None
    module = types.ModuleType("optgen_spec_" + os.path.splitext(os.path.basename(path))[0])
    module.__file__ = path
    try:
        exec(code, module.__dict__)
    except (Exception, SystemExit) as e:  # spec code is user code: every failure is a spec error
        raise spec_line_error(e, path) from None
    specs = [v for v in module.__dict__.values() if isinstance(v, Spec)]
    if isinstance(module.__dict__.get("spec"), Spec):   # the file's own, beside its bases
        specs = [module.__dict__["spec"]]
    if len(specs) != 1:
        raise SpecError(f"a spec file must create exactly one Spec (or name it 'spec'), "
                        f"found {len(specs)}", file=path,
                        hint="spec = Spec('name', __doc__)")
    spec = specs[0]
    if base is not None:
        wrap = module.__dict__.get("wrap")
        if not callable(wrap):
            raise SpecError(f"{os.path.basename(path)} is not a wrapper (it defines no "
                            "wrap(base)), so base= does not apply", file=path,
                            hint="drop --base/base=, which applies to wrapper specs such as lars")
        try:
            spec = wrap(base_spec(base))
        except Exception as e:
            raise spec_line_error(e, path) from None
    spec.file, spec.source = path, source
    return spec


def base_spec(name: str) -> Spec:
    """Load catalog spec ``name`` to build on (``Spec.extend``). The artifact key of a spec
    that does this covers the base's source too (optgen.core.cache)."""
    return load_spec(catalog.resolve(name))
