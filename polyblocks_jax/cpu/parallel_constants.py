"""Vectors a parallel loop reads from outside, computed again inside it.

``convert-scf-to-openmp`` outlines each ``scf.parallel``'s body into a function of its own,
and every value the body reads from outside reaches it through memory, as an opaque load.
A vector made from constants and scalars (a vector.step, a broadcast loop index, an i1 mask
comparing them) then folds into nothing LLVM can see: a row's ``i + step<1> > splat(j)`` stays
a vector add and compare per row where one scalar compare would do, and an i1 vector is
packed into bytes and unpacked at every use. Cloned at the top of the body, from the
constants and scalars it is made of (scalars cross as plain words), such values fold there.
"""
from __future__ import annotations

from mlir import ir

from polyblocks_jax.options import Options
from polyblocks_jax.passes.transform import walk

_LEAVES = frozenset({"arith.constant", "vector.step", "ub.poison"})
# Elementwise ops without side effects: a clone computes the same result, at a cost of a
# few instructions where the body runs.
_PURE = frozenset({"vector.broadcast", "vector.shape_cast", "vector.splat", "arith.index_cast", "arith.addi",
                   "arith.subi", "arith.muli", "arith.andi", "arith.ori", "arith.extsi", "arith.extui",
                   "arith.trunci", "arith.sitofp", "arith.uitofp", "arith.cmpi"})


def clone_vectors_into_parallel_loops(module: ir.Module, _options: Options) -> bool:
    """Give every ``scf.parallel`` of ``module`` its own copies of the vectors it reads from
    outside that are computed from constants and scalars alone; False where none reads one."""
    changed = False
    for loop in [op for op in walk(module.operation) if op.name == "scf.parallel"]:
        changed |= _clone_into(loop)
    return changed


def computed_from_constants(op: ir.Operation, scalars: bool = False) -> bool:
    """Whether ``op`` computes its results from constants (and, where ``scalars``, from any
    value that is not a vector) alone, by ops without side effects."""
    if op.name in _LEAVES:
        return True
    return op.name in _PURE and all(_from_constants(v, scalars) for v in op.operands)


def _from_constants(value: ir.Value, scalars: bool) -> bool:
    if scalars and not isinstance(value.type, ir.VectorType):
        return True
    source = _defining_op(value)
    return source is not None and computed_from_constants(source, scalars)


def _clone_into(loop: ir.Operation) -> bool:
    first = loop.regions[0].blocks[0].operations[0]
    clones: dict[ir.Operation, ir.Operation] = {}
    changed = False
    for op in walk(loop):
        for index, value in enumerate(op.operands):
            source = _defining_op(value)
            if (source is None or not isinstance(value.type, ir.VectorType) or _inside(source, loop)
                    or not computed_from_constants(source, True)):
                continue
            op.operands[index] = _clone(source, clones, first).results[ir.OpResult(value).result_number]
            changed = True
    return changed


def _defining_op(value: ir.Value) -> ir.Operation | None:
    return None if isinstance(value.owner, ir.Block) else value.owner.operation


def _inside(op: ir.Operation, loop: ir.Operation) -> bool:
    parent = op.parent
    while parent is not None:
        if parent.operation == loop:
            return True
        parent = parent.parent
    return False


def _clone(op: ir.Operation, clones: dict[ir.Operation, ir.Operation], before: ir.Operation) -> ir.Operation:
    """``op`` cloned before ``before``, the ops of its vector operands cloned first (each once
    per loop); its scalar operands stay the values outside, which the body may read."""
    if op not in clones:
        operands = {index: _clone(_defining_op(value), clones, before).results[ir.OpResult(value).result_number]
                    for index, value in enumerate(op.operands) if isinstance(value.type, ir.VectorType)}
        clone = op.clone(ip=ir.InsertionPoint(before))
        for index, value in operands.items():
            clone.operands[index] = value
        clones[op] = clone
    return clones[op]
