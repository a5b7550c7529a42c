"""The sum of the squares of a scaled gradient's elements, summed in float64 (each square
in the kernel's dtype: the runtime takes a gradient again with a scale of 2**-64 where its
float32 squares overflow): the runtime's ``clip_global_norm`` and non-finite check run
this spec's reduction pass on every gradient (its update, which leaves ``w`` as it is,
never runs).

    total = sum over the elements of (scale * grad)**2
"""
from optgen.dsl import Spec, global_sum

spec = Spec("sum_of_squares", __doc__, reference="clip_global_norm")
scale = spec.hyper("scale", 1.0, "scale >= 0", "the gradient's factor (rescale_grad)")
total = spec.state("total", 0.0, "the sum of squares", shape="scalar")


@spec.update
def sum_of_squares(w, grad, flags):
    g = scale * grad
    return {total: global_sum(g * g), w: w}
