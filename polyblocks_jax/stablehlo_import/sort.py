"""stablehlo.sort and chlo.top_k: a bottom-up merge sort on tensors, in scf loops.

The merge sort is stable (it takes from the right run only when the comparator says
right < left), so it serves stable and unstable sorts alike; after sorting runs of 8 in
registers it runs ceil(log2 (n / 8)) passes,
each a loop nest over every row that merges runs of width 2^p into a fresh tensor
(passes are unrolled, so the comparator body is imported once per pass). top_k selects,
one pass over each row, a vector of it at a time.
"""
from __future__ import annotations

from typing import Callable, Sequence

from jaxlib.mlir import ir as jir
from mlir import ir
from mlir.dialects import arith, scf, tensor

from polyblocks_jax.dtypes import DType, TensorSpec
from polyblocks_jax.stablehlo_import import reader
from polyblocks_jax.tensor_ir import builders, slices
from polyblocks_jax.stablehlo_import.elementwise import total_order_key
from polyblocks_jax.stablehlo_import.complex_values import flatten, unflatten
from polyblocks_jax.stablehlo_import.registry import computes_composite, converts, converts_complex
from polyblocks_jax.tensor_ir.types import element_type

# Elements of a row sorted in registers before the merge passes: 28 compare-exchanges for 8,
# in place of three passes.
_BLOCK = 8
_TOP_K_CHUNK = 16  # elements of a row top_k tests at once against its k-th best (a vector of f32)
# less(a, b): i1 "a sorts before b", given the elements of every operand at two positions.
Less = Callable[[Sequence[ir.Value], Sequence[ir.Value]], ir.Value]


@converts("stablehlo.sort")
@converts_complex("stablehlo.sort")
def sort(cx, op):
    """A complex operand is sorted as its two parts, paired again for the comparator."""
    dimension = reader.i64(op.attr("dimension")) % op.operand_specs[0].rank
    less = comparator_less(cx, op.op.regions[0].blocks[0], op.operand_specs)
    return unflatten(merge_sort(flatten(op.operands), op.operand_specs[0].shape, dimension, less),
                     op.result_specs)


def comparator_less(cx, comparator: jir.Block, specs: Sequence[TensorSpec]) -> Less:
    """``less`` calling a StableHLO comparator body (arguments lhs0, rhs0, lhs1, rhs1, ...)
    on operands of ``specs``, given their flattened elements (complex_values.flatten)."""
    def less(a, b):
        a, b = unflatten(a, specs), unflatten(b, specs)
        args = [v for pair in zip(a, b) for v in pair]
        return builders.to_scalar(cx.import_block(comparator, args, scalar=True)[0])
    return less


def merge_sort(values: list[ir.Value], shape: Sequence[int], dimension: int, less: Less) -> list[ir.Value]:
    """``values`` (same shape) sorted together along ``dimension`` by ``less``, stably: runs of
    ``_BLOCK`` sorted in registers, then merged pairwise."""
    n = shape[dimension]
    if n < 2:
        return values
    values = _sorted_blocks(values, shape, dimension, less)
    width = _BLOCK
    while width < n:
        values = _merge_pass(values, shape, dimension, width, less)
        width *= 2
    return values


def _row_positions(ivs: list[ir.Value], dimension: int):
    """(read_at, write_at): the indices of position ``k`` of a row, in the operand (``ivs``
    are the row's other indices) and in the row's slice of a result."""
    def read_at(k):
        return ivs[:dimension] + [k] + ivs[dimension:]

    def write_at(k):
        zero = builders.index_constant(0)
        return [zero] * dimension + [k] + [zero] * (len(ivs) - dimension)
    return read_at, write_at


def _sorted_blocks(src: list[ir.Value], shape: Sequence[int], dimension: int, less: Less) -> list[ir.Value]:
    """Each run of ``_BLOCK`` elements of each row (the last one shorter) sorted by odd-even
    transposition: rounds of compare-exchanges of neighbours, in registers, without branches.
    It swaps two elements only where the right one sorts strictly first, so it is stable; and
    it replaces the merge passes of the shortest runs, which cost the most per element (a
    loop of two steps per pair of runs, each step waiting on the last)."""
    n = shape[dimension]
    dst = [tensor.EmptyOp(list(shape), builders.elem_type_of(v)).result for v in src]

    def row(ivs, dst):
        read_at, write_at = _row_positions(ivs, dimension)

        def block(lo: ir.Value, dst: list[ir.Value], size: int) -> list[ir.Value]:
            at = [arith.addi(lo, builders.index_constant(t)) for t in range(size)]
            elements = [[tensor.ExtractOp(s, read_at(k)).result for s in src] for k in at]
            for step in range(size):
                for t in range(step % 2, size - 1, 2):
                    left, right = elements[t], elements[t + 1]
                    swap = less(right, left)
                    elements[t] = [arith.select(swap, r, l) for l, r in zip(left, right)]
                    elements[t + 1] = [arith.select(swap, l, r) for l, r in zip(left, right)]
            for k, values in zip(at, elements):
                dst = [tensor.InsertOp(v, d, write_at(k)).result for v, d in zip(values, dst)]
            return dst
        whole = n - n % _BLOCK
        if whole:
            dst = builders.for_loop(builders.index_constant(0), builders.index_constant(whole),
                                    builders.index_constant(_BLOCK), dst, lambda lo, d: block(lo, d, _BLOCK))
        if n % _BLOCK:
            dst = block(builders.index_constant(whole), dst, n % _BLOCK)
        return dst

    return _parallel_rows(list(shape), dimension, dst, row)


def _merge_pass(src: list[ir.Value], shape: Sequence[int], dimension: int, width: int,
                less: Less) -> list[ir.Value]:
    """Merge each pair of adjacent sorted runs of ``width`` elements into a fresh tensor."""
    n = shape[dimension]
    dst = [tensor.EmptyOp(list(shape), builders.elem_type_of(v)).result for v in src]

    def row(ivs, dst):
        read_at, write_at = _row_positions(ivs, dimension)

        def runs(lo, dst):
            mid = _min_index(arith.addi(lo, builders.index_constant(width)), n)
            hi = _min_index(arith.addi(lo, builders.index_constant(2 * width)), n)
            return _merge_runs(src, dst, lo, mid, hi, n, read_at, write_at, less)
        return builders.for_loop(builders.index_constant(0), builders.index_constant(n),
                                 builders.index_constant(2 * width), dst, runs)

    return _parallel_rows(list(shape), dimension, dst, row)


def _merge_runs(src, dst, lo, mid, hi, n, read_at, write_at, less) -> list[ir.Value]:
    """Merge ``src[lo:mid]`` and ``src[mid:hi]`` into ``dst[lo:hi]``: from both ends at once,
    the first half of the stable merge's output from the front and the rest from the back (one
    scf.for). Each step of a merge waits on the previous one's choice (a load, a compare, a
    select); two independent chains finish in half the steps."""
    one = builders.index_constant(1)
    length = arith.subi(hi, lo)
    steps = arith.divui(arith.addi(length, one), builders.index_constant(2))

    def read(i):  # positions stay in bounds: a clamped one is read but never chosen
        return [tensor.ExtractOp(s, read_at(arith.maxsi(_min_index(i, n - 1), builders.index_constant(0)))).result
                for s in src]

    def step(k, carried):
        i, j, back_i, back_j, *out = carried
        # The front takes the right run's element only where it sorts strictly before the left's.
        left, right = read(i), read(j)
        take_right = arith.andi(arith.cmpi(arith.CmpIPredicate.slt, j, hi),
                                arith.ori(arith.cmpi(arith.CmpIPredicate.sge, i, mid), less(right, left)))
        front = [arith.select(take_right, r, l) for r, l in zip(right, left)]
        # The back takes the left run's element only where the right's sorts strictly before it
        # (equal ones: the right run's come last, as in the stable merge).
        back_left, back_right = read(back_i), read(back_j)
        take_left = arith.andi(arith.cmpi(arith.CmpIPredicate.sge, back_i, lo),
                               arith.ori(arith.cmpi(arith.CmpIPredicate.slt, back_j, mid),
                                         less(back_right, back_left)))
        back = [arith.select(take_left, l, r) for l, r in zip(back_left, back_right)]
        # Of an odd length, the last step's two writes are one: the element left, in the middle.
        out = [tensor.InsertOp(f, o, write_at(arith.addi(lo, k))).result for f, o in zip(front, out)]
        last = arith.subi(arith.subi(hi, one), k)
        out = [tensor.InsertOp(b, o, write_at(last)).result for b, o in zip(back, out)]
        return [arith.select(take_right, i, arith.addi(i, one)), arith.select(take_right, arith.addi(j, one), j),
                arith.select(take_left, arith.subi(back_i, one), back_i),
                arith.select(take_left, back_j, arith.subi(back_j, one)), *out]
    start = [lo, mid, arith.subi(mid, one), arith.subi(hi, one), *dst]
    return builders.for_loop(builders.index_constant(0), steps, one, start, step)[4:]


def _min_index(value: ir.Value, bound: int) -> ir.Value:
    return arith.minsi(value, builders.index_constant(bound))


@converts("chlo.top_k")
@computes_composite("chlo.top_k")  # (along the last axis: see pjrt/lowering_rules.py)
def top_k(cx, op):
    """The k largest along the last dimension, in descending total order, ties by lower index
    (XLA CPU's TopK); indices are i32. Each row is scanned once and its k best so far kept,
    sorted, in the results' row: an element that beats the k-th takes its place among them
    (a count of those it does not beat, then a shift). O(n) comparisons and O(k) per entry,
    where sorting the whole row would take O(n log n). The
    comparisons go by chunks of a vector, each compared at once with the k-th best; only a
    chunk where some element beats it (or while fewer than k are kept) goes element by element."""
    (operand,), (spec,) = op.operands, op.operand_specs
    values_spec, indices_spec = op.result_specs
    k, n = values_spec.shape[-1], spec.shape[-1]
    if 0 in values_spec.shape:  # nothing to select (k = 0, or no rows)
        return [builders.empty(values_spec), builders.empty(indices_spec)]
    index_type = element_type(indices_spec.dtype)

    def less(a: ir.Value, b: ir.Value) -> ir.Value:
        return _total_order_less(a, b, spec.dtype)

    def row(ivs, results):
        origin = [builders.index_constant(0)] * len(ivs)  # the results' rows are slices

        def kth(values):
            return tensor.ExtractOp(values, [*origin, builders.index_constant(k - 1)]).result

        def room(filled):
            return arith.cmpi(arith.CmpIPredicate.slt, filled, builders.index_constant(k))

        def element(j, carried):
            values, indices, filled = carried
            x = tensor.ExtractOp(operand, [*ivs, j]).result
            branch = scf.IfOp(arith.ori(room(filled), less(kth(values), x)), [values.type, indices.type],
                              has_else=True)
            with ir.InsertionPoint(branch.then_block):
                position = arith.index_cast(index_type, j)
                scf.YieldOp(_enter(values, indices, x, position, filled, origin, k, less))
            with ir.InsertionPoint(branch.else_block):
                scf.YieldOp([values, indices])
            grown = arith.select(room(filled), arith.addi(filled, builders.index_constant(1)), filled)
            return [*branch.results, grown]

        def chunk(c, carried):
            # Once the best are k, few elements beat the k-th: a chunk none of which does
            # (one compare of vectors) is passed over, not entered element by element.
            *carried, flag = carried
            elements = slices.extract_slice(operand, [1] * len(ivs) + [_TOP_K_CHUNK], [*ivs, c], shape=[_TOP_K_CHUNK])
            flag = _any_beats(elements, flag, kth(carried[0]), less)
            branch = scf.IfOp(arith.ori(room(carried[2]), _is_set(flag)), [v.type for v in carried], has_else=True)
            with ir.InsertionPoint(branch.then_block):
                scf.YieldOp(builders.for_loop(c, arith.addi(c, builders.index_constant(_TOP_K_CHUNK)),
                                              builders.index_constant(1), carried, element))
            with ir.InsertionPoint(branch.else_block):
                scf.YieldOp(carried)
            return [*branch.results, flag]

        carried = [*results, builders.index_constant(0)]
        chunked = n - n % _TOP_K_CHUNK
        if chunked:
            # The flag goes from one chunk to the next: one buffer, not one allocated a chunk.
            flag = builders.filled(builders.splat(0, ir.IntegerType.get_signless(32)), [])
            carried = builders.for_loop(builders.index_constant(0), builders.index_constant(chunked),
                                        builders.index_constant(_TOP_K_CHUNK), [*carried, flag], chunk)[:3]
        if chunked < n:  # the last elements, one by one
            carried = builders.for_loop(builders.index_constant(chunked), builders.index_constant(n),
                                        builders.index_constant(1), carried, element)
        return carried[:2]
    return _parallel_rows(list(spec.shape), spec.rank - 1,
                          [builders.empty(values_spec), builders.empty(indices_spec)], row)


def _any_beats(elements: ir.Value, flag: ir.Value, last: ir.Value, less: Less) -> ir.Value:
    """``flag`` (a rank-0 i32 tensor) set to whether any of the 1-D ``elements`` beats
    ``last`` (``less(last, x)``): an OR over them, a linalg reduction, which the vectorizer
    makes one compare of vectors."""
    i32 = ir.IntegerType.get_signless(32)
    cleared = builders.fill(builders.splat(0, i32), flag)

    def body(x, acc):
        return [arith.ori(acc, arith.extui(i32, less(last, x)))]
    return builders.generic([elements], [cleared], [ir.AffineMap.get_identity(1), ir.AffineMap.get(1, 0, [])],
                            ["reduction"], body)[0]


def _is_set(flag: ir.Value) -> ir.Value:
    """i1: whether the rank-0 i32 tensor ``flag`` is not zero."""
    i32 = ir.IntegerType.get_signless(32)
    return arith.cmpi(arith.CmpIPredicate.ne, tensor.ExtractOp(flag, []).result, builders.splat(0, i32))


def _parallel_rows(shape: list[int], dimension: int, outs: list[ir.Value],
                   body: Callable[[list[ir.Value], list[ir.Value]], Sequence[ir.Value]]) -> list[ir.Value]:
    """An scf.forall over the rows along ``dimension`` of an operand of ``shape`` (sorts and
    selections of rows, which the host shares out among its threads): ``body(ivs, rows)``
    gets the row's indices (every dim but ``dimension``) and each output's row (a slice, its
    other dims of size 1) and returns the rows updated."""
    bounds = [s for d, s in enumerate(shape) if d != dimension]
    if not bounds:
        return list(body([], outs))
    loop = scf.ForallOp([0] * len(bounds), bounds, [1] * len(bounds), outs)
    with ir.InsertionPoint(loop.body):
        ivs = list(loop.induction_variables)
        offsets = ivs[:dimension] + [0] + ivs[dimension:]
        rows = [slices.extract_slice(o, [builders.shape_of(o)[d] if d == dimension else 1 for d in range(len(shape))],
                                     offsets) for o in loop.inner_iter_args]
        updated = body(ivs, rows)
        with ir.InsertionPoint(scf.InParallelOp().region.blocks[0]):
            for row, out in zip(updated, loop.inner_iter_args):
                slices.parallel_insert_slice(row, out, offsets)
    return list(loop.results)


def _enter(values: ir.Value, indices: ir.Value, x: ir.Value, position: ir.Value, filled: ir.Value,
           origin: list[ir.Value], k: int, less: Less) -> list[ir.Value]:
    """The k best of a row with ``x`` (at ``position``) entered: after those of the ``filled``
    kept that it does not beat (ties keep the earlier), the rest shifted down, the last out."""
    kept = arith.minsi(filled, builders.index_constant(k))
    zero, one = builders.index_constant(0), builders.index_constant(1)

    def count(i, carried):
        value = tensor.ExtractOp(values, [*origin, i]).result
        stays = arith.andi(arith.cmpi(arith.CmpIPredicate.slt, i, kept), arith.xori(less(value, x), builders.splat(True, ir.IntegerType.get_signless(1))))
        return [arith.addi(carried[0], arith.select(stays, one, zero))]
    slot = builders.for_loop(zero, builders.index_constant(k), one, [zero], count)[0]

    def shift(t, carried):
        to = arith.subi(builders.index_constant(k - 1), t)
        source = arith.subi(to, one)
        return [tensor.InsertOp(tensor.ExtractOp(c, [*origin, source]).result, c, [*origin, to]).result for c in carried]
    moved = builders.for_loop(zero, arith.subi(builders.index_constant(k - 1), slot), one, [values, indices], shift)
    return [tensor.InsertOp(v, c, [*origin, slot]).result for v, c in zip((x, position), moved)]


def leading(value: ir.Value, dimension: int, k: int) -> ir.Value:
    """The first ``k`` elements of ``value`` along ``dimension``."""
    shape = builders.shape_of(value)
    sizes = [k if d == dimension else s for d, s in enumerate(shape)]
    return slices.extract_slice(value, sizes, [0] * len(shape))


def _total_order_less(a: ir.Value, b: ir.Value, dtype: DType) -> ir.Value:
    """``a < b`` in XLA's total order: for floats -NaN < -inf < ... < -0 < +0 < ... < +NaN."""
    if not dtype.is_float:
        pred = arith.CmpIPredicate.ult if dtype.is_unsigned else arith.CmpIPredicate.slt
        return arith.cmpi(pred, a, b)
    return arith.cmpi(arith.CmpIPredicate.slt, total_order_key(a, dtype.bits), total_order_key(b, dtype.bits))

