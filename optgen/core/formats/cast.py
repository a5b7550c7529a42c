"""Cast state formats: a state stored in another float dtype, which the kernel widens
on load and rounds into on store (optgen.compiler.lower's widen/narrow, by the dtype
in ``KernelIR.storage``).

    "bf16"     bfloat16, rounded to nearest even (2 bytes a value instead of 4)
    "bf16sr"   bfloat16, rounded stochastically (optgen/core/rounding.py): unbiased, so
               updates smaller than a bfloat16 step survive on average; also asked for
               as "bf16" with ``stochastic_rounding=True``

The stored text of a cast format is its dtype ("bfloat16").

May import: the registry.
"""
from __future__ import annotations

from .registry import Format, StateFormat, register


class Cast(StateFormat):
    dtypes = {"bf16": "bfloat16", "bf16sr": "bfloat16"}   # format -> stored dtype
    twins = {"bf16": "bf16sr"}     # a format -> its stochastically rounded twin
    names = tuple(dtypes)

    def parse(self, owner: str, what: str, text: str) -> Format | None:
        return Format(text, self, self.dtypes[text]) if text in self.dtypes else None

    def stochastic(self, fmt: Format) -> bool:
        """Whether stores round stochastically (optgen/core/rounding.py)."""
        return fmt.name not in self.twins and fmt.name in self.twins.values()

    def rounded(self, fmt: Format) -> Format:
        """The stochastically rounded twin of ``fmt`` (itself if it has none)."""
        return Format(self.twins.get(fmt.name, fmt.name), self, fmt.dtype)


CAST = register(Cast())
STOCHASTIC = CAST.parse("formats", "the format", "bf16sr")   # the parameter's format
                                                          # without a master copy
