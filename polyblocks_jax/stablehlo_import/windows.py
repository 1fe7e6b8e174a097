"""Window ops: stablehlo.reduce_window and stablehlo.select_and_scatter.

reduce_window pads its operands with their init values (base dilation becomes interior
padding), then reduces every window: with a linalg pooling named op when the body is one
max/min/add over the spatial dims of an N..C or NC.. layout, with a linalg.generic running
the imported body otherwise. XLA folds the init value once and skips padding; folding
padding filled with the init value is the same when the init value is a constant neutral
for the body (what JAX emits), and otherwise a mask makes the generic skip padding. A
cumulative window (what jnp.cumsum and lax.cummax emit: one window spanning a whole
dimension, padded on one side) becomes a loop carrying the running slice, so a scan costs
O(n) rather than O(n^2); the scanned axis goes first where its slices would be strided.

select_and_scatter first reduces each window to the offset of its selected element, then,
for each operand element, folds the source values of the windows that selected it. Where
windows overlap with strides (a 3x3 max pooling with strides 2), the operand's elements of
one residue modulo the strides lie at the same offsets in the same few windows: per residue,
one elementwise op over shifted slices of the selections and the source, written into every
s-th element; no division, no gather.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable, Sequence

import numpy as np
from jaxlib.mlir import ir as jir
from mlir import ir
from mlir.dialects import arith, linalg, tensor

from polyblocks_jax.dtypes import DTYPES, TensorSpec
from polyblocks_jax.stablehlo_import import reader
from polyblocks_jax.tensor_ir import builders, layout, slices
from polyblocks_jax.stablehlo_import.complex_values import flat_specs, flatten, unflatten
from polyblocks_jax.stablehlo_import.convert import convert_value
from polyblocks_jax.stablehlo_import.reducers import half_precision_combiner, single_op
from polyblocks_jax.stablehlo_import.registry import converts, converts_complex

_POOLING_BODIES = {"stablehlo.maximum": "max", "stablehlo.minimum": "min", "stablehlo.add": "sum"}


@dataclasses.dataclass(frozen=True)
class _Window:
    dims: list[int]
    strides: list[int]
    base_dilations: list[int]
    window_dilations: list[int]
    low: list[int]
    high: list[int]

    @staticmethod
    def read(op, rank: int) -> "_Window":
        def ints(name: str) -> list[int]:
            return reader.i64_list(op.attr(name)) or [1] * rank
        padding = reader.i64_list(op.attr("padding")) or [0] * (2 * rank)
        return _Window(ints("window_dimensions"), ints("window_strides"), ints("base_dilations"),
                       ints("window_dilations"), padding[0::2], padding[1::2])

    def pads(self) -> bool:
        """Whether the padded operand holds elements that are not the operand's."""
        return any(p > 0 for p in self.low + self.high) or any(b > 1 for b in self.base_dilations)


# ---------------------------------------------------------------- reduce_window

# fold(accumulators, elements): the reduction body on scalars, both lists flattened
# (complex_values.flatten), returning the new accumulators flattened.
Fold = Callable[[Sequence[ir.Value], Sequence[ir.Value]], list[ir.Value]]


@converts("stablehlo.reduce_window")
@converts_complex("stablehlo.reduce_window")
def reduce_window(cx, op):
    """A complex operand is reduced as its two parts, paired again for the body."""
    n = len(op.operands) // 2
    specs = op.operand_specs[:n]
    xs, inits = flatten(op.operands[:n]), [builders.to_scalar(v) for v in flatten(op.operands[n:])]
    spec = op.operand_specs[0]
    if op.scalar:
        raise op.unsupported("reduce_window inside a reduction body")
    win = _Window.read(op, spec.rank)
    body = op.op.regions[0].blocks[0]

    def fold(accs: Sequence[ir.Value], elems: Sequence[ir.Value]) -> list[ir.Value]:
        return flatten(cx.import_block(body, unflatten(accs, specs) + unflatten(elems, specs), scalar=True))
    combine = half_precision_combiner(body, specs)
    if combine is None:
        return unflatten(_reduce_windows(fold, xs, inits, flat_specs(specs), op, win), op.result_specs)
    # A 16-bit float sum, max or min in f32, each output rounded once (a prefix sum of bf16
    # probabilities, jnp.cumsum, drifts by as many roundings as terms rounded at every step).
    f32 = DTYPES["f32"]
    wide = _reduce_windows(lambda accs, elems: [combine(accs[0], elems[0])],
                           [convert_value(xs[0], spec.dtype, f32)], [convert_value(inits[0], spec.dtype, f32)],
                           [TensorSpec(spec.shape, f32)], op, win)
    return [convert_value(wide[0], f32, spec.dtype)]


def _reduce_windows(fold: Fold, xs: list[ir.Value], inits: list[ir.Value], specs: list[TensorSpec], op,
                    win: _Window) -> list[ir.Value]:
    """reduce_window of ``op``'s windows over ``xs`` (flattened, of ``specs``) from ``inits``
    by ``fold``, flattened."""
    n = len(op.operands) // 2
    spec, body = op.operand_specs[0], op.op.regions[0].blocks[0]
    axis = _cumulative_axis(win, spec)
    if axis is not None:
        return _cumulative_along_rows(fold, xs, inits, specs, *axis)
    padded = [_pad(x, init, win) for x, init in zip(xs, inits)]
    outs = [builders.filled(init, s.shape) for init, s in zip(inits, flat_specs(op.result_specs))]
    if win.pads() and not _is_identity(op.op.operands[n], single_op(body), spec):
        # XLA folds only the operand's elements, never padding: mask the padding out.
        return _window_generic(fold, padded, outs, win, _mask(spec.shape, win))
    pooling = _pooling_op(body, win, specs[0])  # (the result's type is the operand's)
    if pooling is not None:
        named, spatial = pooling
        return [named(padded[0], _window_tensor([win.dims[d] for d in spatial]), outs=outs,
                      strides=[win.strides[d] for d in spatial],
                      dilations=[win.window_dilations[d] for d in spatial])]
    return _window_generic(fold, padded, outs, win)


def _window_generic(fold: Fold, padded: list[ir.Value], outs: list[ir.Value],
                    win: _Window, mask: ir.Value | None = None) -> list[ir.Value]:
    """Loops (output dims..., window dims...); output i reads padded[i*stride + k*dilation].

    With ``mask`` (true where ``padded`` holds an operand element) other elements are skipped.
    """
    rank = len(win.dims)
    d = [ir.AffineExpr.get_dim(i) for i in range(2 * rank)]
    read = _map(2 * rank, [d[i] * win.strides[i] + d[rank + i] * win.window_dilations[i]
                           for i in range(rank)])
    ins = padded + ([mask] if mask is not None else [])
    maps = [read] * len(ins) + [_map(2 * rank, d[rank:])] + [_map(2 * rank, d[:rank])] * len(outs)

    def body(*args):
        elems, accs = args[:len(padded)], args[len(ins) + 1:]
        folded = fold(accs, elems)
        if mask is None:
            return folded
        return [arith.select(args[len(padded)], f, acc) for f, acc in zip(folded, accs)]
    return builders.generic([*ins, _window_tensor(win.dims)], outs, maps,
                            ["parallel"] * rank + ["reduction"] * rank, body)


def _pooling_op(body: jir.Block, win: _Window, spec: TensorSpec) -> tuple[Callable, list[int]] | None:
    """The linalg pooling named op for a single max/min/add body and a pooling layout, if any."""
    name = single_op(body)
    if name not in _POOLING_BODIES or spec.dtype.is_bool or spec.dtype.is_narrow or spec.dtype.is_complex:  # op by op
        return None
    kind = _POOLING_BODIES[name]
    if kind != "sum" and spec.dtype.is_unsigned:
        kind += "_unsigned"
    layouts = {3: ("nwc", "ncw"), 4: ("nhwc", "nchw"), 5: ("ndhwc", None)}.get(spec.rank, ())
    for order, kept in zip(layouts, ((0, spec.rank - 1), (0, 1))):
        named = getattr(linalg, f"pooling_{order}_{kind}", None) if order else None
        if named and all(win.dims[i] == 1 and win.strides[i] == 1 for i in kept):
            return named, [i for i in range(spec.rank) if i not in kept]
    return None


def _cumulative_axis(win: _Window, spec: TensorSpec) -> tuple[int, bool] | None:
    """(axis, reverse) when each output is the fold of a prefix (or suffix) along one axis."""
    rank = spec.rank
    if any(s != 1 for s in win.strides + win.base_dilations + win.window_dilations):
        return None
    wide = [i for i in range(rank) if win.dims[i] != 1 or win.low[i] or win.high[i]]
    if len(wide) != 1:
        return None
    (axis,) = wide
    n = spec.shape[axis]
    if n < 2 or win.dims[axis] != n or sorted((win.low[axis], win.high[axis])) != [0, n - 1]:
        return None
    return axis, win.high[axis] == n - 1


def _is_identity(init: jir.Value, body_op: str | None, spec: TensorSpec) -> bool:
    """Whether ``init`` is a constant neutral for ``body_op``: padding may then hold copies
    of it, which folding leaves the result unchanged, as XLA's skipping padding does."""
    value = reader.scalar_constant(init)
    if value is None or body_op is None or spec.dtype.is_narrow:  # narrow: masked, simply
        return False
    dt = spec.dtype
    if dt.is_complex:
        return value == {"stablehlo.add": 0, "stablehlo.multiply": 1}.get(body_op)
    if dt.is_float:
        low, high = -np.inf, np.inf
    elif dt.is_bool:
        low, high = False, True
    else:
        low, high = np.iinfo(dt.numpy).min, np.iinfo(dt.numpy).max
    neutral = {"stablehlo.add": 0, "stablehlo.or": 0, "stablehlo.multiply": 1,
               "stablehlo.maximum": low, "stablehlo.minimum": high,
               "stablehlo.and": True if dt.is_bool else np.array(-1).astype(dt.numpy)}
    return body_op in neutral and value == np.array(neutral[body_op]).astype(value.dtype)


_LINE_BYTES = 64  # a cache line


def _cumulative_along_rows(fold: Fold, xs: list[ir.Value], inits: list[ir.Value],
                           specs: list[TensorSpec], axis: int, reverse: bool) -> list[ir.Value]:
    """``_cumulative``, with the axis moved first where its slices would be narrower than a
    cache line: each step then reads a contiguous slice, not one element per line, which repays the
    two transposes many times over."""
    spec = specs[0]
    inner = int(np.prod(spec.shape[axis + 1:], dtype=np.int64)) * spec.dtype.itemsize
    if axis == 0 or inner >= _LINE_BYTES:
        return _cumulative(fold, xs, inits, specs, axis, reverse)
    perm = [axis] + [d for d in range(spec.rank) if d != axis]
    moved = [TensorSpec(tuple(s.shape[d] for d in perm), s.dtype) for s in specs]
    results = _cumulative(fold, [layout.transpose(x, perm) for x in xs], inits, moved, 0, reverse)
    back = [perm.index(d) for d in range(spec.rank)]
    return [layout.transpose(r, back) for r in results]


def _cumulative(fold: Fold, xs: list[ir.Value], inits: list[ir.Value],
                specs: list[TensorSpec], axis: int, reverse: bool) -> list[ir.Value]:
    """A loop along ``axis`` folding each slice into the running one, then storing it."""
    n = specs[0].shape[axis]
    slice_specs = [TensorSpec(tuple(1 if i == axis else s for i, s in enumerate(sp.shape)), sp.dtype)
                   for sp in specs]
    running = [builders.filled(init, s.shape) for init, s in zip(inits, slice_specs)]
    results = [builders.empty(s) for s in specs]
    identity = ir.AffineMap.get_identity(specs[0].rank)

    def step(ivs, carried):
        pos = arith.subi(builders.index_constant(n - 1), ivs[0]) if reverse else ivs[0]
        offsets = [pos if i == axis else 0 for i in range(specs[0].rank)]
        cur = [slices.extract_slice(x, s.shape, offsets) for x, s in zip(xs, slice_specs)]
        k = len(xs)
        new = builders.generic(cur, carried[k:], [identity] * (2 * k), ["parallel"] * specs[0].rank,
                               lambda *a: fold(a[k:], a[:k]))
        stored = [slices.insert_slice(v, out, offsets) for v, out in zip(new, carried[:k])]
        return stored + new
    return builders.loop_nest([n], results + running, step)[:len(xs)]


# ---------------------------------------------------------------- select_and_scatter

# Taps read as slices by one elementwise op (a window's taps for the selection, a residue's
# for the scatter, two slices each); beyond, the general forms (a large window, unit strides).
_MAX_SLICED_TAPS = 16


@converts("stablehlo.select_and_scatter")
def select_and_scatter(cx, op):
    x, source, init = op.operands
    spec, src_spec = op.operand_specs[0], op.operand_specs[1]
    if op.scalar:
        raise op.unsupported("select_and_scatter inside a reduction body")
    win = _Window.read(op, spec.rank)
    select_body, scatter_body = (r.blocks[0] for r in op.op.regions)
    selected = _select(cx, select_body, x, spec, win, src_spec)
    out = builders.filled(builders.to_scalar(init), op.result_specs[0].shape)
    if _tiles(win, spec.shape, src_spec.shape):
        return [_scatter_tiled(cx, scatter_body, source, selected, out, win, src_spec)]
    residues = _scatter_residues(win, spec.shape, src_spec.shape)
    if residues is not None:
        return [_scatter_by_residues(cx, scatter_body, source, selected, builders.to_scalar(init), win, residues)]
    return [_scatter(cx, scatter_body, source, selected, out, win, src_spec)]


def _select(cx, body: jir.Block, x: ir.Value, spec: TensorSpec, win: _Window,
            src_spec: TensorSpec) -> ir.Value:
    """Per window, the row-major offset (i32) of the element ``body`` selects; -1 if none.

    Padding is never selected: a mask of the operand's positions rides along when padded.
    """
    rank = spec.rank
    ins = [_pad(x, 0, win)]
    if win.pads():
        ins.append(_mask(spec.shape, win))
    if math.prod(win.dims) <= _MAX_SLICED_TAPS:
        return _select_by_taps(cx, body, ins, win, src_spec)
    d = [ir.AffineExpr.get_dim(i) for i in range(2 * rank)]
    read = _map(2 * rank, [d[i] * win.strides[i] + d[rank + i] for i in range(rank)])
    pos_spec = TensorSpec(src_spec.shape, spec.dtype)
    outs = [builders.empty(pos_spec),
            builders.filled(builders.splat(-1, _offset_type()), src_spec.shape)]
    maps = [read] * len(ins) + [_map(2 * rank, d[rank:])] + [_map(2 * rank, d[:rank])] * 2

    def pick(cand, *rest):
        valid, (cur, cur_pos) = rest[:len(ins) - 1], rest[-2:]
        offset = arith.index_cast(_offset_type(), _linearize([_loop_index(rank + i) for i in range(rank)], win.dims))
        (keep,) = cx.import_block(body, [cur, cand], scalar=True)
        empty_so_far = arith.cmpi(arith.CmpIPredicate.slt, cur_pos, builders.splat(0, _offset_type()))
        take = arith.ori(empty_so_far, arith.xori(keep, builders.splat(True, _i1())))
        if valid:
            take = arith.andi(take, valid[0])
        return [arith.select(take, cand, cur), arith.select(take, offset, cur_pos)]
    return builders.generic([*ins, _window_tensor(win.dims)], outs, maps,
                            ["parallel"] * rank + ["reduction"] * rank, pick)[1]


def _select_by_taps(cx, body: jir.Block, ins: list[ir.Value], win: _Window, src_spec: TensorSpec) -> ir.Value:
    """``_select`` of a small window as one elementwise op over the windows: each tap's
    elements (and mask) a strided slice of the padded operand, taken in the window's
    row-major order; vectorized along the channels, where the window loops inside the
    channel loop would keep the reduction scalar."""
    windows, taps = list(src_spec.shape), []
    for tap in itertools.product(*[range(k) for k in win.dims]):
        taps.append([slices.extract_slice(v, windows, list(tap), win.strides) for v in ins])

    def pick(*args):
        cur, cur_pos = args[0], builders.splat(-1, _offset_type())
        for offset in range(len(taps)):
            cand, *valid = args[len(ins) * offset:len(ins) * (offset + 1)]
            (keep,) = cx.import_block(body, [cur, cand], scalar=True)
            empty_so_far = arith.cmpi(arith.CmpIPredicate.slt, cur_pos, builders.splat(0, _offset_type()))
            take = arith.ori(empty_so_far, arith.xori(keep, builders.splat(True, _i1())))
            if valid:
                take = arith.andi(take, valid[0])
            cur = arith.select(take, cand, cur)
            cur_pos = arith.select(take, builders.splat(offset, _offset_type()), cur_pos)
        return cur_pos
    flat = [v for tap in taps for v in tap]
    out = tensor.EmptyOp(windows, _offset_type()).result
    return builders.parallel_generic(flat, out, [ir.AffineMap.get_identity(len(windows))] * len(flat), pick)


def _scatter(cx, body: jir.Block, source: ir.Value, selected: ir.Value, out: ir.Value,
             win: _Window, src_spec: TensorSpec) -> ir.Value:
    """For each operand element p, fold source[w] over the windows w that selected p.

    The window offsets are walked backwards so that windows come in row-major order, the
    order in which XLA applies the scatter body.
    """
    rank = src_spec.rank
    d = [ir.AffineExpr.get_dim(i) for i in range(2 * rank)]
    maps = [_map(2 * rank, d[rank:]), _map(2 * rank, d[:rank])]

    def gather(_, acc):
        offsets, windows, hits = [], [], []
        for i in range(rank):
            k = arith.subi(builders.index_constant(win.dims[i] - 1), _loop_index(rank + i))
            t = arith.subi(arith.addi(_loop_index(i), builders.index_constant(win.low[i])), k)
            w = arith.divsi(arith.maxsi(t, builders.index_constant(0)), builders.index_constant(win.strides[i]))
            hits += [_cmp("sge", t, 0), _cmp("eq", arith.remsi(t, builders.index_constant(win.strides[i])), 0),
                     _cmp("slt", w, src_spec.shape[i])]
            offsets.append(k)
            windows.append(arith.minsi(w, builders.index_constant(src_spec.shape[i] - 1)))
        chosen = tensor.extract(selected, windows)
        offset = arith.index_cast(_offset_type(), _linearize(offsets, win.dims))
        hits.append(arith.cmpi(arith.CmpIPredicate.eq, chosen, offset))
        hit = hits[0]
        for h in hits[1:]:
            hit = arith.andi(hit, h)
        (folded,) = cx.import_block(body, [acc, tensor.extract(source, windows)], scalar=True)
        return [arith.select(hit, folded, acc)]
    return builders.generic([_window_tensor(win.dims)], [out], maps,
                            ["parallel"] * rank + ["reduction"] * rank, gather)[0]


@dataclasses.dataclass(frozen=True)
class _Residue:
    """The operand elements ``r, r + s, ...`` (``count`` of them) of one dim, s its window
    stride: element ``r + s*m`` is at offset ``first + s*j`` of window ``window + m - j``,
    for ``j < taps``."""
    r: int
    count: int
    first: int
    taps: int
    window: int


def _scatter_residues(win: _Window, shape: Sequence[int], windows: Sequence[int]) -> list[list[_Residue]] | None:
    """Per dim, the residues of its operand elements modulo the window stride; None where
    padding is negative or the residues read too many taps (select_and_scatter has no dilations)."""
    if any(p < 0 for p in win.low + win.high):
        return None
    dims = []
    for n, count, k, s, low in zip(shape, windows, win.dims, win.strides, win.low):
        dims.append([])
        for r in range(min(s, n)):
            first = (r + low) % s  # padded position r + low + s*m is offset first + s*j of a window
            taps = max(0, -(-(k - first) // s))
            dims[-1].append(_Residue(r, -(-(n - r) // s), first, taps, (r + low - first) // s))
    taps = max(math.prod(r.taps for r in combination) for combination in itertools.product(*dims))
    return dims if taps <= _MAX_SLICED_TAPS else None


def _scatter_by_residues(cx, body: jir.Block, source: ir.Value, selected: ir.Value, init: ir.Value,
                         win: _Window, residues: list[list[_Residue]]) -> ir.Value:
    """``_scatter`` one residue combination at a time: an elementwise op folding, in the
    windows' row-major order, each tap's source where its window selected that offset (the
    selections padded with -1 for windows past the edges), into every s-th element."""
    shape = [sum(r.count for r in dim) for dim in residues]
    out = builders.filled(init, shape) if any(not r.taps for dim in residues for r in dim) \
        else tensor.EmptyOp(shape, init.type).result
    below = [max(0, max(r.taps - 1 - r.window for r in dim)) for dim in residues]
    above = [max(0, max(r.window + r.count for r in dim) - n) for dim, n in zip(residues, builders.shape_of(source))]
    selected = slices.pad(selected, -1, below, above, [0] * len(shape))
    source = slices.pad(source, 0, below, above, [0] * len(shape))
    for combination in itertools.product(*residues):
        if not all(r.taps for r in combination):
            continue
        counts = [r.count for r in combination]
        ins, offsets = [], []
        for j in itertools.product(*[reversed(range(r.taps)) for r in combination]):  # windows in row-major order
            at = [r.window - t + b for r, t, b in zip(combination, j, below)]
            ins += [slices.extract_slice(selected, counts, at), slices.extract_slice(source, counts, at)]
            offsets.append(_linear([r.first + s * t for r, t, s in zip(combination, j, win.strides)], win.dims))

        def fold(*args):
            acc = args[-1]
            for tap, offset in enumerate(offsets):
                sel, src = args[2 * tap:2 * tap + 2]
                (folded,) = cx.import_block(body, [acc, src], scalar=True)
                hit = arith.cmpi(arith.CmpIPredicate.eq, sel, builders.splat(offset, _offset_type()))
                acc = arith.select(hit, folded, acc)
            return acc
        part = builders.parallel_generic(ins, builders.filled(init, counts),
                                         [ir.AffineMap.get_identity(len(shape))] * len(ins), fold)
        out = slices.insert_slice(part, out, [r.r for r in combination], win.strides)
    return out


def _linear(offsets: Sequence[int], dims: Sequence[int]) -> int:
    """Row-major offset of ``offsets`` in a box of ``dims`` (Python ints)."""
    flat = 0
    for i, n in zip(offsets, dims):
        flat = flat * n + i
    return flat


def _tiles(win: _Window, shape: Sequence[int], windows: Sequence[int]) -> bool:
    """Whether the windows tile the operand: strides equal to the window, no padding or
    dilation, every element in one window (2x2 max pooling with strides 2)."""
    return (win.strides == win.dims and not win.pads() and all(w == 1 for w in win.window_dilations)
            and all(n == w * k for n, w, k in zip(shape, windows, win.dims)))


def _scatter_tiled(cx, body: jir.Block, source: ir.Value, selected: ir.Value, out: ir.Value,
                   win: _Window, src_spec: TensorSpec) -> ir.Value:
    """``_scatter`` where the windows tile the operand: each element has one window, so the
    result is elementwise over the operand viewed as (window, offset) dims, the source folded
    in where its window selected that offset: plain maps, vectorized along the channels
    (the general form tests every window that could hold an element, with divisions)."""
    rank = src_spec.rank
    shape, groups, window_dims, offset_dims = [], [], [], {}
    for i, (n, k) in enumerate(zip(src_spec.shape, win.dims)):
        groups.append([len(shape)] + ([len(shape) + 1] if k > 1 else []))
        window_dims.append(len(shape))
        shape.append(n)
        if k > 1:
            offset_dims[i] = len(shape)
            shape.append(k)
    d = [ir.AffineExpr.get_dim(j) for j in range(len(shape))]
    window_map = _map(len(shape), [d[j] for j in window_dims])

    def place(sel, src, acc):
        offsets = [_loop_index(offset_dims[i]) if i in offset_dims else builders.index_constant(0) for i in range(rank)]
        hit = arith.cmpi(arith.CmpIPredicate.eq, sel, arith.index_cast(_offset_type(), _linearize(offsets, win.dims)))
        (folded,) = cx.import_block(body, [acc, src], scalar=True)
        return [arith.select(hit, folded, acc)]
    viewed = layout.expand(out, groups, shape)
    placed = builders.generic([selected, source], [viewed], [window_map, window_map, _map(len(shape), d)],
                              ["parallel"] * len(shape), place)[0]
    return layout.collapse(placed, groups, builders.shape_of(out))


# ---------------------------------------------------------------- helpers

def _map(n_dims: int, exprs: Sequence[ir.AffineExpr]) -> ir.AffineMap:
    return ir.AffineMap.get(n_dims, 0, list(exprs))


def _window_tensor(dims: Sequence[int]) -> ir.Value:
    """A shape-only operand that gives the window loops their bounds (as pooling ops use)."""
    return tensor.EmptyOp(list(dims), _i1()).result


def _pad(x: ir.Value, value: ir.Value | bool, win: _Window) -> ir.Value:
    """``x`` inside a tensor filled with ``value``: edge padding, base dilation as interior."""
    return slices.pad(x, value, win.low, win.high, [b - 1 for b in win.base_dilations])


def _mask(shape: Sequence[int], win: _Window) -> ir.Value:
    """Booleans shaped like the padded operand: true where an operand element lies."""
    inside = builders.splat(True, ir.RankedTensorType.get(list(shape), _i1()))
    return _pad(inside, False, win)


def _linearize(indices: Sequence[ir.Value], dims: Sequence[int]) -> ir.Value:
    """Row-major offset of ``indices`` (index values) in a box of ``dims``."""
    flat = builders.index_constant(0)
    for i, n in zip(indices, dims):
        flat = arith.addi(arith.muli(flat, builders.index_constant(n)), i)
    return flat


def _cmp(pred: str, lhs: ir.Value, rhs: int) -> ir.Value:
    return arith.cmpi(getattr(arith.CmpIPredicate, pred), lhs, builders.index_constant(rhs))


def _offset_type() -> ir.Type:
    """A window's selected element: its row-major offset in the window (-1: none yet)."""
    return ir.IntegerType.get_signless(32)


def _i1() -> ir.Type:
    return ir.IntegerType.get_signless(1)


def _loop_index(dim: int) -> ir.Value:
    # linalg.IndexOp, not linalg.index: the opdsl import shadows that name.
    return linalg.IndexOp(dim).result
