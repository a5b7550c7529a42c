"""The kernel core: the modules that decide what a kernel computes and that both the
compiler (optgen.compiler) and the runtime (optgen.runtime) read: state formats and
their quantizers, stochastic rounding, the scalar-expression grammar, hyperparameter
rules, tensor views, the reference interpreter and the mixed-precision dtypes; and what
both sides need of an artifact: its key and cache paths (cache), the spec catalog, the
manifest checks, and TVM's runtime library (tvm_runtime). It imports nothing else of
optgen. The cache key hashes the kernel-deciding modules (cache.KERNEL_SEMANTIC)."""
