"""stablehlo.gather and stablehlo.scatter, in the general form (batching dims included).

Out-of-bounds start indices follow XLA: a gather clamps each start index so that the
whole slice lies inside the operand; a scatter drops the whole update window when its
start index would put any part of the window outside the operand.
"""
from __future__ import annotations

from typing import Sequence

from jaxlib.mlir.dialects import stablehlo
from mlir import ir
from mlir.dialects import arith, linalg, scf, tensor

from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.stablehlo_import import reader
from polyblocks_jax.tensor_ir import builders, slices
from polyblocks_jax.stablehlo_import.complex_values import flatten, unflatten
from polyblocks_jax.stablehlo_import.registry import converts, converts_complex


def _start_indices(indices: ir.Value, spec: TensorSpec, batch: Sequence[ir.Value],
                   index_vector_dim: int, count: int) -> list[ir.Value]:
    """The ``count`` start indices (as ``index``) at batch position ``batch`` of ``indices``."""
    starts = []
    for k in range(count):
        pos = list(batch)
        if index_vector_dim < spec.rank:
            pos.insert(index_vector_dim, builders.index_constant(k))
        starts.append(slices.to_index(tensor.ExtractOp(indices, pos).result, spec.dtype.is_unsigned))
    return starts


def _in_range(start: ir.Value, high: int, unsigned: bool) -> ir.Value:
    """``0 <= start <= high`` as an i1 (always false when ``high`` < 0)."""
    if high < 0:
        return builders.splat(False, ir.IntegerType.get_signless(1))
    le = arith.cmpi(arith.CmpIPredicate.ule if unsigned else arith.CmpIPredicate.sle,
                    start, builders.index_constant(high))
    if unsigned:
        return le
    return arith.andi(le, arith.cmpi(arith.CmpIPredicate.sge, start, builders.index_constant(0)))


def _batch_position(batch: Sequence[ir.Value], indices_dim: int, index_vector_dim: int) -> ir.Value:
    """The batch-loop variable of dimension ``indices_dim`` of the indices tensor."""
    return batch[indices_dim - (indices_dim > index_vector_dim)]


@converts("stablehlo.gather")
def gather(cx, op):
    operand, indices = op.operands
    operand_spec, indices_spec = op.operand_specs
    out = op.result_specs[0]
    dn = stablehlo.GatherDimensionNumbers(op.attr("dimension_numbers"))
    slice_sizes = reader.i64_list(op.attr("slice_sizes"))
    offset_dims = list(dn.offset_dims)
    batch_dims = [d for d in range(out.rank) if d not in offset_dims]
    skipped = set(dn.collapsed_slice_dims) | set(dn.operand_batching_dims)
    window_dims = [d for d in range(operand_spec.rank) if d not in skipped]
    ivd, unsigned = dn.index_vector_dim, indices_spec.dtype.is_unsigned

    def element(_out):
        ivs = [linalg.IndexOp(d).result for d in range(out.rank)]
        batch = [ivs[d] for d in batch_dims]
        pos = [builders.index_constant(0)] * operand_spec.rank
        starts = _start_indices(indices, indices_spec, batch, ivd, len(dn.start_index_map))
        for d, start in zip(dn.start_index_map, starts):
            pos[d] = slices.clamp_start(start, operand_spec.shape[d] - slice_sizes[d], unsigned)
        for d, idim in zip(dn.operand_batching_dims, dn.start_indices_batching_dims):
            pos[d] = _batch_position(batch, idim, ivd)
        for d, out_dim in zip(window_dims, offset_dims):
            pos[d] = arith.addi(pos[d], ivs[out_dim])
        return tensor.ExtractOp(operand, pos).result

    return [builders.parallel_generic([], builders.empty(out), [], element)]


# A window whose innermost dim is contiguous in both tensors, at least this long, is combined
# as one elementwise op on slices (vectorized like any other); shorter ones element by element.
MIN_SLICED_WINDOW = 16


@converts("stablehlo.scatter")
@converts_complex("stablehlo.scatter")
def scatter(cx, op):
    """Sequential on purpose: update windows are applied one after the other, in the order
    of the scatter indices, so duplicates combine exactly as in XLA's loop. (The elements
    of one window are distinct positions: combining them at once changes nothing.)
    A complex operand is scattered as its two parts (complex_values.py)."""
    n = (len(op.operands) - 1) // 2
    indices, specs = op.operands[n], op.operand_specs[:n]
    inputs, updates = flatten(op.operands[:n]), flatten(op.operands[n + 1:])
    flat_n = len(inputs)
    in_spec, indices_spec, upd_spec = op.operand_specs[0], op.operand_specs[n], op.operand_specs[n + 1]
    dn = stablehlo.ScatterDimensionNumbers(op.attr("scatter_dimension_numbers"))
    update_window_dims = list(dn.update_window_dims)
    scatter_dims = [d for d in range(upd_spec.rank) if d not in update_window_dims]
    skipped = set(dn.inserted_window_dims) | set(dn.input_batching_dims)
    window_operand_dims = [d for d in range(in_spec.rank) if d not in skipped]
    window_size = [1] * in_spec.rank
    for d, ud in zip(window_operand_dims, update_window_dims):
        window_size[d] = upd_spec.shape[ud]
    ivd, unsigned = dn.index_vector_dim, indices_spec.dtype.is_unsigned
    body = op.op.regions[0].blocks[0]

    sliced = (bool(update_window_dims) and update_window_dims[-1] == upd_spec.rank - 1
              and window_operand_dims[-1] == in_spec.rank - 1 and upd_spec.shape[-1] >= MIN_SLICED_WINDOW
              and 0 not in upd_spec.shape)

    def combine(current: Sequence[ir.Value], new: Sequence[ir.Value]) -> list[ir.Value]:
        """The update computation on scalars: the operands' elements, then the updates'."""
        return flatten(cx.import_block(body, unflatten(current, specs) + unflatten(new, specs), scalar=True))

    def combine_slices(batch, results, base):
        """The window as slices: the operands' windows combined with the updates' by one
        elementwise op writing into the operands' slices (in place)."""
        new = _update_windows(updates, upd_spec, update_window_dims, scatter_dims, batch)
        window = builders.shape_of(new[0])
        current = [slices.extract_slice(v, window_size, base, shape=window) for v in results]
        identity = ir.AffineMap.get_identity(len(window))
        combined = builders.generic(
            new, current, [identity] * (2 * flat_n), ["parallel"] * len(window),
            lambda *args: combine(args[flat_n:], args[:flat_n]))
        return [slices.insert_slice(c, v, base, sizes=window_size) for c, v in zip(combined, results)]

    def apply_window(batch, results, base):
        if sliced:
            return combine_slices(batch, results, base)

        def element(window, values):
            upd_pos = [None] * upd_spec.rank
            for d, iv in zip(scatter_dims, batch):
                upd_pos[d] = iv
            for d, iv in zip(update_window_dims, window):
                upd_pos[d] = iv
            pos = list(base)
            for d, iv in zip(window_operand_dims, window):
                pos[d] = arith.addi(pos[d], iv)
            current = [tensor.ExtractOp(v, pos).result for v in values]
            new = [tensor.ExtractOp(u, upd_pos).result for u in updates]
            combined = combine(current, new)
            return [tensor.InsertOp(c, v, pos).result for c, v in zip(combined, values)]
        return builders.loop_nest([upd_spec.shape[d] for d in update_window_dims], results, element)

    def window_at(batch, results):
        starts = _start_indices(indices, indices_spec, batch, ivd, len(dn.scattered_dims_to_operand_dims))
        base = [builders.index_constant(0)] * in_spec.rank
        valid = builders.splat(True, ir.IntegerType.get_signless(1))
        for d, start in zip(dn.scattered_dims_to_operand_dims, starts):
            base[d] = start
            valid = arith.andi(valid, _in_range(start, in_spec.shape[d] - window_size[d], unsigned))
        for d, idim in zip(dn.input_batching_dims, dn.scatter_indices_batching_dims):
            base[d] = _batch_position(batch, idim, ivd)
        return _if_else(valid, results, lambda: apply_window(batch, results, base))

    return unflatten(builders.loop_nest([upd_spec.shape[d] for d in scatter_dims], inputs, window_at),
                     op.result_specs)


def _update_windows(updates: Sequence[ir.Value], spec: TensorSpec, window_dims: Sequence[int],
                    scatter_dims: Sequence[int], batch: Sequence[ir.Value]) -> list[ir.Value]:
    """Each update's window at scatter position ``batch``, without its scatter dims."""
    offsets: list[slices.Offset] = [0] * spec.rank
    sizes = [1] * spec.rank
    for d, iv in zip(scatter_dims, batch):
        offsets[d] = iv
    for d in window_dims:
        sizes[d] = spec.shape[d]
    window = [spec.shape[d] for d in window_dims]
    return [slices.extract_slice(u, sizes, offsets, shape=window) for u in updates]


def _if_else(cond: ir.Value, unchanged: list[ir.Value], then) -> list[ir.Value]:
    """scf.if yielding ``then()`` when ``cond`` holds and ``unchanged`` otherwise."""
    if_op = scf.IfOp(cond, [v.type for v in unchanged], has_else=True)
    with ir.InsertionPoint(if_op.then_block):
        scf.YieldOp(then())
    with ir.InsertionPoint(if_op.else_block):
        scf.YieldOp(unchanged)
    return list(if_op.results)
