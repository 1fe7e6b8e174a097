"""stablehlo.reduce -> linalg.reduce, its body imported op by op on scalars.

Variadic reduces (argmax/argmin reduce values and indices together) map to one
linalg.reduce with several inputs and inits. The accumulators start from the init
values, so a reduction over zero-size dimensions yields the init value.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import linalg

from polyblocks_jax.stablehlo_import import builders, reader
from polyblocks_jax.stablehlo_import.registry import converts
from polyblocks_jax.stablehlo_import.types import element_type


@converts("stablehlo.reduce")
def reduce(cx, op):
    n = len(op.operands) // 2
    inputs, inits = op.operands[:n], op.operands[n:]
    dims = sorted(reader.i64_list(op.attr("dimensions")))  # linalg.reduce wants them ascending
    if not dims:  # XLA returns the operands unchanged: the init values are not applied
        return inputs
    accs = [linalg.fill(builders.to_scalar(init), outs=[builders.empty(spec)])
            for init, spec in zip(inits, op.result_specs)]
    reduce_op = linalg.ReduceOp([a.type for a in accs], inputs, accs, dims)
    elems = [element_type(s.dtype) for s in op.operand_specs]
    body = reduce_op.regions[0].blocks.append(*elems)
    with ir.InsertionPoint(body):
        # StableHLO's reducer takes (accumulators..., elements...), as XLA calls it with the
        # running value on the left; linalg.reduce's block is (elements..., accumulators...).
        args = list(body.arguments)
        results = cx.import_block(op.op.regions[0].blocks[0], args[n:] + args[:n], scalar=True)
        linalg.YieldOp(results)
    return list(reduce_op.results)
