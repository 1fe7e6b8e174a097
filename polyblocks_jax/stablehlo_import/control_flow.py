"""Control flow: stablehlo.while, stablehlo.if and stablehlo.case -> scf on tensors.

Regions are imported in tensor mode with ``Importer.import_block``; they may use values of
the enclosing blocks, as StableHLO allows. Predicates and the case index are rank-0
tensors, read with tensor.extract. One-shot bufferization turns the loop-carried tensors
into buffers and scf becomes cf in the target's lowering, so trip counts may depend on data.
A complex value is carried as its two parts (complex_values.py).
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf

from polyblocks_jax.stablehlo_import import host_callbacks
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.complex_values import flat_specs, flatten, unflatten
from polyblocks_jax.stablehlo_import.registry import converts, converts_complex
from polyblocks_jax.tensor_ir.types import element_type, tensor_type


@converts("stablehlo.while")
@converts_complex("stablehlo.while")
def while_(cx, op):
    cond, body = (region.blocks[0] for region in op.op.regions)
    flat = flatten(op.operands)
    types = [v.type for v in flat]
    loop = scf.WhileOp(types, flat)
    before = loop.before.blocks.append(*types)
    with ir.InsertionPoint(before):
        (pred,) = cx.import_block(cond, unflatten(list(before.arguments), op.operand_specs))
        pred = builders.to_scalar(pred)
        if host_callbacks.calls_back(cx, op.op):  # a callback that raised ends the loop
            pred = host_callbacks.unless_failed(pred)
        scf.ConditionOp(pred, list(before.arguments))
    after = loop.after.blocks.append(*types)
    with ir.InsertionPoint(after):
        scf.YieldOp(flatten(cx.import_block(body, unflatten(list(after.arguments), op.operand_specs))))
    return unflatten(list(loop.results), op.result_specs)


def _result_types(op) -> list[ir.Type]:
    """The types of ``op``'s results, a complex one's as its two parts'."""
    return [element_type(s.dtype) if op.scalar else tensor_type(s) for s in flat_specs(op.result_specs)]


@converts("stablehlo.if")
@converts_complex("stablehlo.if")
def if_(cx, op):
    branch = scf.IfOp(builders.to_scalar(op.operands[0]), _result_types(op), has_else=True)
    for region, block in zip(op.op.regions, (branch.then_block, branch.else_block)):
        with ir.InsertionPoint(block):
            scf.YieldOp(flatten(cx.import_block(region.blocks[0], [])))
    return unflatten(list(branch.results), op.result_specs)


@converts("stablehlo.case")
@converts_complex("stablehlo.case")
def case(cx, op):
    """Branch ``index``; an index outside [0, N) runs the last branch, as in XLA.

    A chain of scf.if (index == 0, else index == 1, ...), not scf.index_switch: one-shot
    bufferization misses the conflicts of index_switch results (a later op writing in place
    into the buffer a returned switch result still holds; seen as a crash in
    buffer-results-to-out-params), while it analyses scf.if fully.
    """
    flat = _branch_chain(cx, list(op.op.regions), 0, builders.to_scalar(op.operands[0]), _result_types(op))
    return unflatten(flat, op.result_specs)


def _branch_chain(cx, regions: list, first: int, index: ir.Value, types: list[ir.Type]) -> list[ir.Value]:
    """The results of ``regions[first]`` if ``index == first``, else of the regions after it;
    the last region runs for every index that selects no earlier one."""
    if first == len(regions) - 1:
        return flatten(cx.import_block(regions[first].blocks[0], []))
    branch = scf.IfOp(arith.cmpi(arith.CmpIPredicate.eq, index, builders.constant_like(first, index)),
                      types, has_else=True)
    with ir.InsertionPoint(branch.then_block):
        scf.YieldOp(flatten(cx.import_block(regions[first].blocks[0], [])))
    with ir.InsertionPoint(branch.else_block):
        scf.YieldOp(_branch_chain(cx, regions, first + 1, index, types))
    return list(branch.results)
