"""The cache key hashes exactly the code that decides what a kernel computes
(optgen.core.cache.KERNEL_SEMANTIC): editing any of it changes the key, so a cached
kernel is never reused after its compiler, core or templates changed; editing the CLI,
the torch drop-ins or the errors' wording keeps the key. Each edit is made in a copy of
the installed packages, never in the tree itself."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from optgen.core import cache

FOLDERS = cache.package_folders()


def _semantic_files() -> list[tuple[str, str]]:
    """(package, path inside its folder) of every file the key hashes."""
    out = []
    for package, names in cache.KERNEL_SEMANTIC.items():
        top = Path(FOLDERS[package])
        files = [p.relative_to(top).as_posix() for p in sorted(top.rglob("*"))
                 if p.suffix in (".py", ".j2") and "__pycache__" not in p.parts]
        out += [(package, f) for f in files if names is None or f in names
                or any(n.endswith("/") and f.startswith(n) for n in names)]
    return out


SEMANTIC = _semantic_files()
NOT_SEMANTIC = [("optgen", "torch/__init__.py"), ("optgen", "torch/torch_checkpoints.py"), ("optgen", "cli.py"),
                ("optgen", "commands.py"), ("optgen", "errors.py"),
                ("optgen.core", "cache.py"), ("optgen.core", "catalog.py")]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> dict[str, str]:
    """A copy of each hashed package's folder: package -> its copy."""
    root = tmp_path_factory.mktemp("tree")
    copies = {}
    for k, (package, folder) in enumerate(FOLDERS.items()):
        copies[package] = str(root / f"{k}-{package}")
        shutil.copytree(folder, copies[package],
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return copies


def _key_after_edit(tree: dict[str, str], package: str, rel: str) -> str:
    path = os.path.join(tree[package], rel)
    with open(path, "rb") as f:
        before = f.read()
    try:
        with open(path, "ab") as f:
            f.write(b"\n# an edit\n")
        return cache.fingerprint(tree)
    finally:
        with open(path, "wb") as f:
            f.write(before)


def test_the_copy_hashes_like_the_installed_tree(tree):
    assert cache.fingerprint(tree) == cache.compiler_fingerprint()


@pytest.mark.parametrize("package, rel", SEMANTIC, ids=[f"{p}:{r}" for p, r in SEMANTIC])
def test_editing_a_kernel_semantic_file_changes_the_key(tree, package, rel):
    assert os.path.isfile(os.path.join(tree[package], rel)), f"{package}: no {rel}"
    assert _key_after_edit(tree, package, rel) != cache.fingerprint(tree)


@pytest.mark.parametrize("package, rel", NOT_SEMANTIC, ids=[f"{p}:{r}" for p, r in NOT_SEMANTIC])
def test_editing_other_code_keeps_the_key(tree, package, rel):
    assert os.path.isfile(os.path.join(tree[package], rel)), f"{package}: no {rel}"
    assert _key_after_edit(tree, package, rel) == cache.fingerprint(tree)


def test_the_key_covers_the_compiler_core_and_templates():
    """The rules the brief of the key states, so the lists cannot silently shrink."""
    files = set(SEMANTIC)
    assert ("optgen.compiler", "lower.py") in files and ("optgen.compiler", "pipeline.py") in files
    for core in ("formats/__init__.py", "formats/registry.py", "formats/blocked.py", "formats/cast.py",
                 "quant.py", "rounding.py", "scalar_expr.py", "hyper.py",
                 "views.py", "reference.py"):
        assert ("optgen.core", core) in files
    assert ("optgen.templates", "kernel_llvm.py.j2") in files
    for spec_facing in ("dsl.py", "declarations.py", "ir.py", "tracing.py", "blocks.py"):
        assert ("optgen", spec_facing) in files


@pytest.mark.parametrize("package", sorted(cache.NOT_SEMANTIC))
def test_every_module_is_classified(package):
    """A module or sub-folder added to optgen/ or optgen/core/ must be put in
    KERNEL_SEMANTIC or NOT_SEMANTIC (a kernel-deciding module left out would let stale
    kernels be reused); sub-folders that are hashed packages of their own are not."""
    top = Path(FOLDERS[package])
    own = {Path(f).resolve() for f in FOLDERS.values()}
    modules = {p.name for p in top.glob("*.py")} | {
        p.name + "/" for p in top.iterdir() if p.is_dir() and p.name != "__pycache__"
        and p.resolve() not in own and any(p.rglob("*.py"))}
    listed = set(cache.KERNEL_SEMANTIC[package] or ()) | set(cache.NOT_SEMANTIC[package])
    assert modules == listed, (f"{package}: unclassified {sorted(modules - listed)}, "
                               f"listed but missing {sorted(listed - modules)}")
