"""The C library's functions, copysign, pow and clamp on the gradient, one state each
(tests/test_math_functions.py measures them against the exact values on edge cases).

    s_f = f(grad)            for f in atan, tanh, erf, log1p, expm1, sinh, cosh
    s_atan2 = atan2(grad, x), s_copysign = copysign(x, grad), s_pow = x ** p,
    s_host = grad * (every function of the hyperparameter p: evaluated on the host)
"""
from optgen.dsl import (Spec, atan, atan2, clamp, copysign, cosh, erf, expm1, log1p, pow,
                        sinh, tanh)

spec = Spec("math_functions", __doc__)
p = spec.hyper("p", 0.5, "p == p", "the exponent of pow")
x = spec.state("x", 1.0, "the second operand (the test sets it)")
UNARY = {"atan": atan, "tanh": tanh, "erf": erf, "log1p": log1p, "expm1": expm1,
         "sinh": sinh, "cosh": cosh}
out = {name: spec.state(f"s_{name}", 0.0, f"{name}(grad)") for name in UNARY}
s_atan2 = spec.state("s_atan2", 0.0, "atan2(grad, x)")
s_copysign = spec.state("s_copysign", 0.0, "copysign(x, grad)")
s_pow = spec.state("s_pow", 0.0, "x ** p")
s_clamp = spec.state("s_clamp", 0.0, "clamp(grad, -1, 2)")
s_host = spec.state("s_host", 0.0, "grad times every function of p (a host scalar)")


@spec.update
def math_functions(w, grad, flags):
    return {**{out[n]: f(grad) for n, f in UNARY.items()}, s_atan2: atan2(grad, x),
            s_copysign: copysign(x, grad), s_pow: pow(x, p), s_clamp: clamp(grad, -1.0, 2.0),
            s_host: grad * (atan(p) + atan2(p, -1.0) + tanh(p) + erf(p) + log1p(p) + expm1(p)
                            + sinh(p) + cosh(p) + copysign(2.0, -p)),
            x: x, w: w}
