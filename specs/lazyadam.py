"""LazyAdam: Adam whose row-sparse gradients update only the rows they name (MindSpore
LazyAdam, MXNet Adam with lazy_update=True).

The rule is specs/adam.py's (MXNet/MindSpore form, use_nesterov included). With a dense
gradient it is Adam. With an ``optgen.RowSparse`` gradient only the listed rows of the
parameter, m and v change; the other rows keep their values, including m and v, which a
dense step would decay. Pass ``lazy_update=False`` to treat a row-sparse gradient as the
dense gradient with zero rows. Duplicate row indices are summed.

Reference: D. P. Kingma, J. Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015;
MindSpore nn.LazyAdam.
"""
from optgen.dsl import Spec, base_spec

adam = base_spec("adam")
spec = Spec.extend(adam, "lazyadam", __doc__)
spec.lazy_update_default = True
spec.update(adam.rule)
