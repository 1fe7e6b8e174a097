"""Transposes and slices of elementwise results computed by the producer itself.

Upstream's elementwise fusion fuses a generic into a generic consumer of its whole result,
one use only: a ``linalg.transpose`` of it, or slices of it (each a part the program goes on
with: an LSTM's four gates, the four blocks of its weight gradient), stop it, and the result
is written out whole, then read back moved. Here, before that fusion:

- a transpose of an elementwise generic, its one use, becomes that generic with its inputs
  read through the permutation, where no input is then read in a transposed order (an outer
  product, a broadcast: the moved copy was the only data movement);
- an elementwise generic whose every use is a slice of it, no element asked for twice,
  becomes one generic per slice, each on the matching slices of its inputs, which the
  fusion then puts into the slice's consumers (an input read backwards, a flip, sliced at
  the mirrored box and read backwards within it).

Either way the ops stay in the producer's block: a use inside a loop would otherwise
recompute the producer at every iteration.
"""
from __future__ import annotations

import math

from mlir import ir
from mlir.dialects import arith, linalg, tensor

from polyblocks_jax.passes.transform import indexing_maps, is_elementwise_generic, move_body, reversal, walk


def compute_moved_results(module: ir.Module) -> None:
    """Fold transposes into their elementwise producers, then slices (consumers first, so a
    sliced generic's own producers get sliced in turn)."""
    for op in [op for op in walk(module.operation) if op.name == "linalg.transpose"]:
        source = _single_use_producer(op)
        if source is not None:
            _fold_transpose(op, source)
    for op in reversed([op for op in walk(module.operation) if _plain_elementwise(op, reversed_ok=True)]):
        slices = [use.owner.operation for use in op.results[0].uses]
        if slices and all(_plain_slice(s, op) for s in slices) and \
                sum(math.prod(_static(s, "static_sizes")) for s in slices) <= _elements(op):
            for s in slices:  # the last one erases ``op``
                _compute_slice(op, s)


def _plain_elementwise(op: ir.Operation, reversed_ok: bool = False) -> bool:
    """An elementwise generic whose output is written in loop order, whose inputs are read
    along loop dims (no constant index; backwards along them, ``c - d``, if ``reversed_ok``)
    and whose body does not ask for its indices."""
    if not is_elementwise_generic(op) or len(op.regions[0].blocks[0].arguments) != len(op.operands):
        return False
    maps = indexing_maps(op)
    return maps[-1] == ir.AffineMap.get_identity(maps[-1].n_dims) and \
        all(isinstance(e, ir.AffineDimExpr) or reversed_ok and reversal(e) is not None
            for m in maps for e in m.results) and \
        not any(inner.name == "linalg.index" for inner in walk(op))


def _single_use_producer(transpose: ir.Operation) -> ir.Operation | None:
    """The elementwise generic ``transpose`` moves, where that is its one use in the same
    block and no input of it would be read transposed."""
    value = transpose.operands[0]
    if not isinstance(value.owner, ir.OpView):
        return None
    source = value.owner.operation
    if not _plain_elementwise(source) or len(list(value.uses)) != 1 or source.parent != transpose.parent:
        return None
    inverse = _inverse(_permutation(transpose))
    for m in indexing_maps(source)[:-1]:
        moved = [inverse[ir.AffineDimExpr(e).position] for e in m.results]
        if moved != sorted(moved):
            return None
    return source


def _fold_transpose(transpose: ir.Operation, source: ir.Operation) -> None:
    """``source`` computed in ``transpose``'s order, into ``transpose``'s init."""
    inverse = _inverse(_permutation(transpose))
    rank = len(inverse)
    maps = [ir.AffineMap.get(rank, 0, [ir.AffineDimExpr.get(inverse[ir.AffineDimExpr(e).position])
                                       for e in m.results]) for m in indexing_maps(source)[:-1]]
    inputs = list(source.operands)[:-1]
    _replace_with_generic(transpose, source, inputs, transpose.operands[1], maps)


def _compute_slice(source: ir.Operation, slice_op: ir.Operation) -> None:
    """``slice_op``'s part of ``source``: a generic on the same parts of its inputs."""
    offsets = _mixed_offsets(slice_op)
    sizes = _static(slice_op, "static_sizes")
    maps = indexing_maps(source)
    with ir.InsertionPoint(slice_op), slice_op.location:
        inputs, input_maps = [], []
        for value, m in zip(list(source.operands)[:-1], maps[:-1]):
            starts, extents, results = [], [], []
            for e in m.results:
                r = reversal(e)
                d = r[0] if r is not None else ir.AffineDimExpr(e).position
                extents.append(sizes[d])
                if r is None:
                    starts.append(offsets[d])
                    results.append(e)
                else:  # loop i of the slice reads c - (offset + i): the slice's (size - 1) - i
                    starts.append(_reversed_start(r[1] - sizes[d] + 1, offsets[d]))
                    results.append(ir.AffineConstantExpr.get(sizes[d] - 1) - ir.AffineDimExpr.get(d))
            inputs.append(_slice(value, starts, extents) if starts else value)
            input_maps.append(ir.AffineMap.get(m.n_dims, 0, results))
        element = ir.RankedTensorType(source.results[0].type).element_type
        init = tensor.EmptyOp(sizes, element).result
    _replace_with_generic(slice_op, source, inputs, init, input_maps)


def _reversed_start(end: int, offset: int | ir.Value) -> int | ir.Value:
    """``end - offset``: the first element a reversed read of a slice at ``offset`` reads."""
    if isinstance(offset, int):
        return end - offset
    return arith.subi(arith.constant(ir.IndexType.get(), end), offset)


def _replace_with_generic(old: ir.Operation, source: ir.Operation, inputs: list[ir.Value], init: ir.Value,
                          input_maps: list[ir.AffineMap]) -> None:
    """Replace ``old`` with a generic of ``source``'s body on ``inputs`` into ``init``."""
    rank = ir.RankedTensorType(init.type).rank
    maps = [*input_maps, ir.AffineMap.get_identity(rank)]
    with ir.InsertionPoint(old), old.location:
        generic = linalg.GenericOp([init.type], inputs, [init],
                                   ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
                                   source.attributes["iterator_types"])
        copy = source.clone()  # its body moves into the new generic; the source may serve others
    move_body(copy, generic.operation)
    copy.erase()
    old.results[0].replace_all_uses_with(generic.results[0])
    old.erase()
    if not list(source.results[0].uses):
        source.erase()


def _slice(value: ir.Value, offsets: list, sizes: list[int]) -> ir.Value:
    """``value[offsets : offsets + sizes]`` (each offset an int or an index value)."""
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    static = [o if isinstance(o, int) else dynamic for o in offsets]
    element = ir.RankedTensorType(value.type).element_type
    return tensor.ExtractSliceOp(ir.RankedTensorType.get(sizes, element), value,
                                 [o for o in offsets if not isinstance(o, int)], [], [],
                                 static, sizes, [1] * len(sizes)).result


def _plain_slice(op: ir.Operation, source: ir.Operation) -> bool:
    """A unit-stride, static-sized slice of ``source``'s result of its full rank, in its block."""
    if op.name != "tensor.extract_slice" or op.parent != source.parent or op.operands[0] != source.results[0]:
        return False
    sizes = _static(op, "static_sizes")
    return all(s >= 0 for s in sizes) and set(_static(op, "static_strides")) == {1} and \
        ir.RankedTensorType(op.results[0].type).shape == sizes and len(op.operands) == 1 + len(_dynamic_offsets(op))


def _mixed_offsets(op: ir.Operation) -> list:
    """The slice's offsets: ints where static, index values where not."""
    dynamic = iter(_dynamic_offsets(op))
    sentinel = ir.ShapedType.get_dynamic_stride_or_offset()
    return [next(dynamic) if o == sentinel else o for o in _static(op, "static_offsets")]


def _dynamic_offsets(op: ir.Operation) -> list[ir.Value]:
    count = _static(op, "static_offsets").count(ir.ShapedType.get_dynamic_stride_or_offset())
    return list(op.operands)[1:1 + count]


def _static(op: ir.Operation, name: str) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


def _elements(op: ir.Operation) -> int:
    return math.prod(ir.RankedTensorType(op.results[0].type).shape)


def _permutation(transpose: ir.Operation) -> list[int]:
    return list(ir.DenseI64ArrayAttr(transpose.attributes["permutation"]))


def _inverse(permutation: list[int]) -> list[int]:
    inverse = [0] * len(permutation)
    for i, p in enumerate(permutation):
        inverse[p] = i
    return inverse
