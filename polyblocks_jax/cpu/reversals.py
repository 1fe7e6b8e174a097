"""Reversed loops (jnp.flip, lax.rev) moved out of indexing maps, into an scf.forall.

An op reading an operand backwards along a loop has ``c - d`` in an indexing map. Upstream
tiling asserts on such a map (``transform.has_reversed_index``), so these ops would stay
scalar loops. Where every reversed loop is parallel
and no operand's innermost dim, those loops become an ``scf.forall`` with one iteration per
index: each iteration slices the operands at ``c - i`` or ``i`` (size 1 along the loop), and
the op inside, its maps plain again, vectorizes along its rows like any other.
"""
from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, linalg, scf, tensor

from polyblocks_jax.passes.transform import indexing_maps, move_body, reduction_loops, reversal, walk


def unreverse_loops(module: ir.Module) -> None:
    """Rewrite every linalg.generic on static tensors whose reversed loops allow it."""
    for op in walk(module.operation):
        if op.name == "linalg.generic":
            reversed_loops = _reversed_loops(op)
            if reversed_loops:
                _into_forall(op, sorted(reversed_loops | _leading_loops(op, reversed_loops)))


def _reversed_loops(op: ir.Operation) -> set[int]:
    """The loops ``op`` reads backwards, when the rewrite applies to all of them: each a
    parallel loop, no operand's innermost index, and every other index a plain loop or a
    constant; static tensors; no ``linalg.index`` of them in the body. Else the empty set."""
    maps = indexing_maps(op)
    reversed_loops = {r[0] for m in maps for e in m.results if (r := reversal(e)) is not None}
    if not reversed_loops or reversed_loops & reduction_loops(op):
        return set()
    for m in maps[len(op.operands) - len(op.results):]:  # each result slice written once per index
        if not reversed_loops <= {loop_of(e) for e in m.results}:
            return set()
    for m in maps:
        if any(loop_of(e) is None and not isinstance(e, ir.AffineConstantExpr) for e in m.results):
            return set()
        if len(m.results) and loop_of(m.results[len(m.results) - 1]) in reversed_loops:
            return set()
    if not all(isinstance(v.type, ir.RankedTensorType) and v.type.has_static_shape for v in [*op.operands, *op.results]):
        return set()
    body = op.regions[0].blocks[0]
    if any(b.operation.name == "linalg.index" and ir.IntegerAttr(b.operation.attributes["dim"]).value in reversed_loops
           for b in body.operations):
        return set()
    return reversed_loops


def _leading_loops(op: ir.Operation, reversed_loops: set[int]) -> set[int]:
    """The parallel loops indexing a result's dims before its last reversed one: in the forall
    too, so that its iterations walk the result in memory order (otherwise each thread
    copies short rows far apart).
    None where the body reads a loop index (``linalg.index``)."""
    if any(b.operation.name == "linalg.index" for b in op.regions[0].blocks[0].operations):
        return set()
    results = indexing_maps(op)[len(op.operands) - len(op.results):]
    positions = [loop_of(e) for e in results[0].results]
    last = max(i for i, loop in enumerate(positions) if loop in reversed_loops)
    return {loop for loop in positions[:last] if loop is not None and loop not in reversed_loops
            and all(loop in {loop_of(e) for e in m.results} for m in results)}


def _into_forall(op: ir.Operation, loops: list[int]) -> None:
    """``op`` as an scf.forall over ``loops``, each iteration the op on the slices of that
    index (an input no loop of which indexes, whole)."""
    maps = indexing_maps(op)
    outs = len(op.results)
    inputs, inits = list(op.operands)[:-outs], list(op.operands)[-outs:]
    extents = _extents(op, maps, loops)
    with ir.InsertionPoint(op), op.location:
        loop = scf.ForallOp([0] * len(loops), extents, [1] * len(loops), inits)
        with ir.InsertionPoint(loop.body):
            index = dict(zip(loops, loop.induction_variables))
            in_slices = [_slice(v, m, index).result if index.keys() & {loop_of(e) for e in m.results} else v
                         for v, m in zip(inputs, maps)]
            out_slices = [_slice(v, m, index) for v, m in zip(loop.inner_iter_args, maps[len(inputs):])]
            inner = linalg.GenericOp([s.result.type for s in out_slices], in_slices,
                                     [s.result for s in out_slices],
                                     ir.ArrayAttr.get([ir.AffineMapAttr.get(_plain(m)) for m in maps]),
                                     op.attributes["iterator_types"])
            move_body(op, inner.operation)
            with ir.InsertionPoint(scf.InParallelOp().region.blocks[0]):
                for result, sliced, out in zip(inner.results, out_slices, loop.inner_iter_args):
                    tensor.ParallelInsertSliceOp(result, out, sliced.offsets, sliced.sizes, sliced.strides,
                                                 sliced.static_offsets, sliced.static_sizes, sliced.static_strides)
    for old, new in zip(op.results, loop.results):
        old.replace_all_uses_with(new)
    op.erase()


def loop_of(e: ir.AffineExpr) -> int | None:
    """The loop an index ``d`` or ``c - d`` reads, else None."""
    r = reversal(e)
    return r[0] if r is not None else e.position if isinstance(e, ir.AffineDimExpr) else None


def _extents(op: ir.Operation, maps: list[ir.AffineMap], loops: list[int]) -> list[int]:
    """Each loop's trip count: the size of an operand dim it indexes."""
    sizes = {}
    for value, m in zip(op.operands, maps):
        for e, size in zip(m.results, ir.RankedTensorType(value.type).shape):
            sizes.setdefault(loop_of(e), size)
    return [sizes[loop] for loop in loops]


def _slice(value: ir.Value, m: ir.AffineMap, index: dict[int, ir.Value]) -> tensor.ExtractSliceOp:
    """``value`` at the forall's index along each dim a forall loop indexes (``c - i`` where
    reversed), whole along the others."""
    shape = ir.RankedTensorType(value.type).shape
    dynamic, offsets, sizes = [], [], []
    for e, size in zip(m.results, shape):
        r, loop = reversal(e), loop_of(e)
        if loop in index:
            dynamic.append(arith.subi(arith.constant(ir.IndexType.get(), r[1]), index[loop]) if r is not None
                           else index[loop])
            offsets.append(ir.ShapedType.get_dynamic_size())
            sizes.append(1)
        else:
            offsets.append(0)
            sizes.append(size)
    element = ir.RankedTensorType(value.type).element_type
    return tensor.ExtractSliceOp(ir.RankedTensorType.get(sizes, element), value, dynamic, [], [],
                                 offsets, sizes, [1] * len(sizes))


def _plain(m: ir.AffineMap) -> ir.AffineMap:
    """``m`` with each ``c - d`` made ``d`` (the loop has one iteration in a slice)."""
    results = [ir.AffineDimExpr.get(r[0]) if (r := reversal(e)) is not None else e for e in m.results]
    return ir.AffineMap.get(m.n_dims, m.n_symbols, results)
