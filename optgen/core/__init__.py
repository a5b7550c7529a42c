"""The kernel core: the modules that decide what a kernel computes and that both the
compiler (optgen.compiler) and the runtime (optgen.runtime) read: state formats and
their quantizers, stochastic rounding, the scalar-expression grammar, hyperparameter
rules, tensor views and the reference interpreter. It imports nothing else of optgen."""
