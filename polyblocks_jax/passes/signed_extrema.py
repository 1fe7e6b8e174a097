"""The importer's float max and min that keep the sign of zero, recognized.

The importer builds a float max as ``select(a == b, merge_bits(a, b), maximumf(a, b))``
(AND of the bits for max, OR for min): ``maximumf`` alone may order -0.0 and +0.0 either
way once lowered. Stages that rewrite reductions (``scaled_extrema``, the host's
vectorizer) recognize that form as one max or min here.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith

from polyblocks_jax.passes.transform import producer

MERGES = {"arith.maximumf": "arith.andi", "arith.minimumf": "arith.ori"}


def signed_zero_combiner(yielded: ir.Value) -> tuple[ir.Operation, list[ir.Operation]] | None:
    """The ``maximumf``/``minimumf`` of the importer's signed-zero-aware max/min that
    produces ``yielded`` and all the ops of that form, or None when it is not one."""
    select = producer(yielded, "arith.select")
    if select is None:
        return None
    compare, merged, extremum = (producer(v, name) for v, name in
                                 zip(select.operands, ("arith.cmpf", "arith.bitcast", "arith.maximumf")))
    extremum = extremum or producer(select.operands[2], "arith.minimumf")
    if compare is None or merged is None or extremum is None:
        return None
    merge = producer(merged.operands[0], MERGES[extremum.name])
    operands = set(extremum.operands)
    if (merge is None or ir.IntegerAttr(compare.attributes["predicate"]).value != arith.CmpFPredicate.OEQ
            or set(compare.operands) != operands):
        return None
    bits = [producer(v, "arith.bitcast") for v in merge.operands]
    if any(b is None for b in bits) or {b.operands[0] for b in bits} != operands:
        return None
    return extremum, [select, compare, merged, merge, *bits, extremum]


def is_signed_zero_combiner(accumulator: ir.BlockArgument, yielded: ir.Value) -> bool:
    """Whether ``yielded`` is a signed-zero-aware max/min of ``accumulator`` and one other
    value, the accumulator used by nothing else."""
    match = signed_zero_combiner(yielded)
    return match is not None and accumulator in match[0].operands \
        and all(use.owner.operation in match[1] for use in accumulator.uses)
