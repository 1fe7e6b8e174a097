"""Register tiling and vectorization of 2-D NHWC convolutions, along channels.

``choose_conv_tiles`` is the cost model: a register tile of output pixels along W by a few
vectors of output channels, accumulated over a block of input channels; of the tiles that
fit the registers, the one with the fewest estimated cycles per FMA
(``tiling.cycles_per_fma``: FMA throughput, loads, and the latency each chain waits on). The transform script tiles every loop
to that block (kernel rows and columns to one), decomposes the 2-D convolution into a 1-D
one, vectorizes it (outer products over input channels) and hoists the accumulators out
of the kh/kw/c loops, like tiling.py's matmul recipe; the script is vectorize.py's, which
applies these tiles.

A 1x1 convolution with unit strides is a matmul on the collapsed image:
``pointwise_convs_to_matmuls`` (a stage before tiling) hands it to the matmul tiling.
"""
from __future__ import annotations

import dataclasses

from mlir import ir
from mlir.dialects import linalg, tensor

from polyblocks_jax.options import Options
from polyblocks_jax.passes.tiling import Hardware, cycles_per_fma
from polyblocks_jax.passes.transform import walk

_MAX_INPUT_CHANNELS = 32  # input channels per step: bounds the unrolled outer products
_MAX_VECTORS = 4          # vectors of output channels per pixel


@dataclasses.dataclass(frozen=True)
class ConvTiles:
    width: int      # output pixels along W held in registers
    channels: int   # output channels (vector lanes) per pixel
    reduce: int     # input channels per step (1 for depthwise)


def choose_conv_tiles(out_width: int, out_channels: int, in_channels: int, elem_bytes: int,
                      hw: Hardware, depthwise: bool = False) -> ConvTiles | None:
    """Tiles for an NHWC convolution, or None when the channels do not fill a vector.

    Pixels (dividing the width) by vectors (dividing the channels), with registers left for
    the kernel vectors, one input operand and the loads LLVM schedules ahead in the unrolled
    input channels (an eighth of the registers: without them the accumulators spill; a 3x3
    convolution on AVX-512, 115 -> 162 GFLOP/s); input channels: the largest divisor up to
    a bound (each is one unrolled outer product per pixel).
    """
    lanes = hw.vector_bits // (8 * elem_bytes)
    registers = hw.vector_registers - hw.vector_registers // 8
    tiles = [(width, vectors) for vectors in range(1, _MAX_VECTORS + 1) if out_channels % (vectors * lanes) == 0
             for width in range(1, out_width + 1) if out_width % width == 0
             and width * vectors + vectors + 1 <= registers]
    if not tiles:
        return None
    width, vectors = min(tiles, key=lambda t: (cycles_per_fma(*t, depthwise), -t[0] * t[1]))
    reduce = 1 if depthwise else _largest_divisor(in_channels, _MAX_INPUT_CHANNELS)
    return ConvTiles(width, vectors * lanes, reduce)


def _largest_divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def loop_tiles(op: ir.Operation, hw: Hardware) -> tuple[tuple[int, ...], frozenset[int]] | None:
    """Tile size per loop of an f32 2-D NHWC convolution and its reduction loops, or None."""
    depthwise = op.name == "linalg.depthwise_conv_2d_nhwc_hwc"
    if op.name != "linalg.conv_2d_nhwc_hwcf" and not depthwise:
        return None
    types = [ir.RankedTensorType(v.type) for v in op.operands]
    if any(not isinstance(t.element_type, ir.F32Type) for t in types):
        return None
    _, _, ow, f = types[2].shape
    c = types[0].shape[-1]
    t = choose_conv_tiles(ow, f, c, 4, hw, depthwise)
    if t is None:
        return None
    # Loops: conv (n, oh, ow, f, kh, kw, c); depthwise (n, oh, ow, c, kh, kw).
    if depthwise:
        return (1, 1, t.width, t.channels, 1, 1), frozenset({4, 5})
    return (1, 1, t.width, t.channels, 1, 1, t.reduce), frozenset({4, 5, 6})


def pointwise_convs_to_matmuls(module: ir.Module, options: Options) -> None:
    """Rewrite each f32 1x1 NHWC convolution with unit strides into a matmul on collapsed
    shapes, (N*H*W x C) @ (C x F), so that the matmul cost model and tiling apply to it."""
    for op in [o for o in walk(module.operation) if _is_pointwise(o)]:
        with ir.InsertionPoint(op), op.location:
            image, kernel, init = op.operands
            n, h, w, f = ir.RankedTensorType(init.type).shape
            c = ir.RankedTensorType(image.type).shape[-1]
            rows = _collapse(image, [n * h * w, c], [[0, 1, 2], [3]])
            weights = _collapse(kernel, [c, f], [[0, 1, 2], [3]])
            acc = _collapse(init, [n * h * w, f], [[0, 1, 2], [3]])
            product = linalg.matmul(rows, weights, outs=[acc])
            result = tensor.ExpandShapeOp(init.type, product, _reassociation([[0, 1, 2], [3]]),
                                          [], ir.DenseI64ArrayAttr.get([n, h, w, f])).result
        op.results[0].replace_all_uses_with(result)
        op.erase()


def _is_pointwise(op: ir.Operation) -> bool:
    if op.name != "linalg.conv_2d_nhwc_hwcf":
        return False
    types = [ir.RankedTensorType(v.type) for v in op.operands]
    strides = list(ir.DenseIntElementsAttr(op.attributes["strides"]))
    return (all(isinstance(t.element_type, ir.F32Type) and t.has_static_shape for t in types)
            and list(types[1].shape[:2]) == [1, 1] and strides == [1, 1])


def _collapse(value: ir.Value, shape: list[int], groups: list[list[int]]) -> ir.Value:
    elem = ir.RankedTensorType(value.type).element_type
    return tensor.CollapseShapeOp(ir.RankedTensorType.get(shape, elem), value, _reassociation(groups)).result


def _reassociation(groups: list[list[int]]) -> ir.ArrayAttr:
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, d) for d in g]) for g in groups])
