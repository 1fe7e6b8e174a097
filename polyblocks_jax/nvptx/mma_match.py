"""Which linalg ops on buffers the mma.sync kernel computes, and its description of them.

Two forms qualify:
- products C[b, m, n] += A[b, m, k] * B[b, k, n] where each letter is a group of loop
  dimensions in this order in every operand (linalg.matmul, batch_matmul, or a generic:
  fusion moves the importer's reshapes through products, so a Dense layer on (batch,
  tokens, features) becomes a generic with two m dimensions); groups of several
  dimensions are merged by memref.collapse_shape views of identity-layout buffers;
- linalg.conv_2d_nhwc_hwcf: A is the input image itself (mma_kernel.ConvWindow), B the
  HWCF filter viewed as (kh kw c) x f, C the output viewed as (n oh ow) x f.

Then the operand types must be ones the matrix unit takes with an f32 accumulator, and
rows 16-byte aligned: k (a convolution's channels) and n multiples of one cp.async, and so
every outer stride and the offsets.
"""
from __future__ import annotations

import dataclasses
import math

from mlir import ir

from polyblocks_jax.nvptx.mma_kernel import ConvWindow, MmaProblem
from polyblocks_jax.nvptx.mma_tiles import COPY_BYTES
from polyblocks_jax.nvptx.target import NvptxTarget
from polyblocks_jax.passes.transform import indexing_maps

_NAMED = ("linalg.matmul", "linalg.batch_matmul")
_CONV = "linalg.conv_2d_nhwc_hwcf"


@dataclasses.dataclass(frozen=True)
class Match:
    """A qualifying op's shape: per operand, the groups of its dimensions the kernel's view merges
    (None: the operand as it is), and the window of a convolution."""
    reassociations: tuple[list[list[int]] | None, ...]
    conv: ConvWindow | None = None


def match(op: ir.Operation) -> Match | None:
    """The form of ``op`` when it is a product or a convolution the kernel computes, else None."""
    if len(op.operands) != 3 or len(op.results):
        return None
    if op.name == _CONV:
        return _conv(op)
    if op.name in _NAMED + ("linalg.generic",):
        return _product(op)
    return None


def problem(op: ir.Operation, form: Match, init: float, unit, target: NvptxTarget) -> MmaProblem | None:
    """The kernel's description of ``op`` in ``form`` starting from ``init``, or None when its types or
    layouts do not fit the unit or the kernel."""
    types = [_collapsed(ir.MemRefType(v.type), g) for v, g in zip(op.operands, form.reassociations)]
    if None in types:
        return None
    a, b, c = types
    unit_op = unit.op_for(str(a.element_type), str(b.element_type))
    if unit_op is None or unit_op.accumulate != str(c.element_type):
        return None
    per_copy = COPY_BYTES // (a.element_type.width // 8)
    k, n = b.shape[-2:]
    *batch, m = c.shape[:-1]
    inner = form.conv.channels if form.conv else k
    if inner % per_copy or n % per_copy or math.prod(batch) > target.max_grid_dims[2]:
        return None
    if not (_aligned(a, per_copy) and _aligned(b, per_copy) and _aligned(c, 2)):
        return None
    tile = unit_op.tile
    return MmaProblem(m, n, k, tuple(batch), "tf32" if unit_op.lhs == "f32" else unit_op.lhs, (tile.m, tile.n, tile.k),
                      tuple(str(t) for t in types), init, form.conv)


def _product(op: ir.Operation) -> Match | None:
    if "indexing_maps" not in op.attributes:  # a named op built without them has the default ones
        nb = _NAMED.index(op.name)
        return Match(tuple([[d] for d in range(nb)] + [[nb], [nb + 1]] for _ in range(3)))
    dims = []
    for map_ in indexing_maps(op):
        exprs = map_.results
        if not all(isinstance(e, ir.AffineDimExpr) for e in exprs):
            return None  # a broadcast operand
        dims.append([ir.AffineDimExpr(e).position for e in exprs])
    a, b, c = dims
    batch, m = [d for d in c if d in a and d in b], [d for d in c if d in a and d not in b]
    n, k = [d for d in c if d in b and d not in a], [d for d in a if d in b and d not in c]
    if not (m and n and k) or a != batch + m + k or b != batch + k + n or c != batch + m + n:
        return None
    if op.name == "linalg.generic":
        iterators = [str(i) for i in ir.ArrayAttr(op.attributes["iterator_types"])]
        if any(("reduction" in i) != (d in k) for d, i in enumerate(iterators)):
            return None
        if not _multiplies_and_adds(op.regions[0].blocks[0]):
            return None
    nb = len(batch)
    return Match(tuple([[d] for d in range(nb)] + [list(range(nb, nb + len(g))), list(range(nb + len(g), nb + len(g) + len(h)))]
                       for g, h in ((m, k), (k, n), (m, n))))


def _multiplies_and_adds(body: ir.Block) -> bool:
    """The body is ``out + ext(a) * ext(b)`` (the extensions optional)."""
    a, b, out = body.arguments
    meaning = {a: "a", b: "b", out: "out"}
    for op in [op.operation for op in body.operations]:
        args = sorted(meaning.get(v, "?") for v in op.operands)
        if op.name == "arith.extf" and args[0] in ("a", "b"):
            meaning[op.result] = args[0]
        elif op.name == "arith.mulf" and args == ["a", "b"]:
            meaning[op.result] = "a*b"
        elif op.name == "arith.addf" and args == ["a*b", "out"]:
            meaning[op.result] = "out+a*b"
        elif op.name == "linalg.yield":
            return args == ["out+a*b"]
        else:
            return False
    return False


def _conv(op: ir.Operation) -> Match:
    filter_ = ir.MemRefType(op.operands[1].type).shape
    output = ir.MemRefType(op.operands[2].type).shape
    strides, dilations = ([int(v) for v in ir.DenseIntElementsAttr(op.attributes[name])]
                          for name in ("strides", "dilations"))
    window = ConvWindow(tuple(output[1:3]), tuple(filter_[:2]), filter_[2], tuple(strides), tuple(dilations))
    return Match((None, [[0, 1, 2], [3]], [[0, 1, 2], [3]]), window)


def _collapsed(type_: ir.MemRefType, groups: list[list[int]] | None) -> ir.MemRefType | None:
    """``type_`` with each group of dimensions merged; None when that needs a non-identity layout merged."""
    if groups is None or all(len(g) == 1 for g in groups):
        return type_
    if str(type_.layout) != str(ir.AffineMapAttr.get(ir.AffineMap.get_identity(type_.rank))):
        return None
    return ir.MemRefType.get([math.prod(type_.shape[d] for d in g) for g in groups], type_.element_type)


def _aligned(type_: ir.MemRefType, elements: int) -> bool:
    """Static layout, unit inner stride, and every row starting at a multiple of ``elements``."""
    strides, offset = type_.get_strides_and_offset()
    if any(d < 0 for d in (*type_.shape, *strides, offset)):  # dynamic: the minimum int64
        return False
    return strides[-1] == 1 and all(s % elements == 0 for s in (*strides[:-1], offset))
