"""optgen's version, in a module that imports nothing: ``optgen.__version__`` and the
manifests the compiler writes (optgen.compiler.write_artifact) read it from here."""
__version__ = "0.1.0"
