"""Control flow: stablehlo.while, stablehlo.if and stablehlo.case -> scf on tensors.

Regions are imported in tensor mode with ``Importer.import_block``; they may use values of
the enclosing blocks, as StableHLO allows. Predicates and the case index are rank-0
tensors, read with tensor.extract. One-shot bufferization turns the loop-carried tensors
into buffers and scf becomes cf in the target's lowering, so trip counts may depend on data.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf

from polyblocks_jax.stablehlo_import import builders, host_callbacks
from polyblocks_jax.stablehlo_import.registry import converts


@converts("stablehlo.while")
def while_(cx, op):
    cond, body = (region.blocks[0] for region in op.op.regions)
    types = [v.type for v in op.operands]
    loop = scf.WhileOp(types, op.operands)
    before = loop.before.blocks.append(*types)
    with ir.InsertionPoint(before):
        (pred,) = cx.import_block(cond, list(before.arguments))
        pred = builders.to_scalar(pred)
        if host_callbacks.calls_back(cx, op.op):  # a callback that raised ends the loop
            pred = host_callbacks.unless_failed(pred)
        scf.ConditionOp(pred, list(before.arguments))
    after = loop.after.blocks.append(*types)
    with ir.InsertionPoint(after):
        scf.YieldOp(cx.import_block(body, list(after.arguments)))
    return list(loop.results)


@converts("stablehlo.if")
def if_(cx, op):
    types = [op.result_type(i) for i in range(len(op.result_specs))]
    branch = scf.IfOp(builders.to_scalar(op.operands[0]), types, has_else=True)
    for region, block in zip(op.op.regions, (branch.then_block, branch.else_block)):
        with ir.InsertionPoint(block):
            scf.YieldOp(cx.import_block(region.blocks[0], []))
    return list(branch.results)


@converts("stablehlo.case")
def case(cx, op):
    """Branch ``index``; an index outside [0, N) runs the last branch, as in XLA.

    A chain of scf.if (index == 0, else index == 1, ...), not scf.index_switch: one-shot
    bufferization misses the conflicts of index_switch results (a later op writing in place
    into the buffer a returned switch result still holds; seen as a crash in
    buffer-results-to-out-params), while it analyses scf.if fully.
    """
    types = [op.result_type(i) for i in range(len(op.result_specs))]
    return _branch_chain(cx, list(op.op.regions), 0, builders.to_scalar(op.operands[0]), types)


def _branch_chain(cx, regions: list, first: int, index: ir.Value, types: list[ir.Type]) -> list[ir.Value]:
    """The results of ``regions[first]`` if ``index == first``, else of the regions after it;
    the last region runs for every index that selects no earlier one."""
    if first == len(regions) - 1:
        return cx.import_block(regions[first].blocks[0], [])
    branch = scf.IfOp(arith.cmpi(arith.CmpIPredicate.eq, index, builders.constant_like(first, index)),
                      types, has_else=True)
    with ir.InsertionPoint(branch.then_block):
        scf.YieldOp(cx.import_block(regions[first].blocks[0], []))
    with ir.InsertionPoint(branch.else_block):
        scf.YieldOp(_branch_chain(cx, regions, first + 1, index, types))
    return list(branch.results)
