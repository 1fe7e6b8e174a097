"""Register tiling and vectorization of 2-D NHWC convolutions, along channels.

``choose_conv_tiles`` is the cost model: a register tile of output pixels along W by one
or two vectors of output channels, accumulated over a block of input channels. The
transform script tiles every loop to that block (kernel rows and columns to one), decomposes
the 2-D convolution into a 1-D one, vectorizes it (outer products over input channels) and
hoists the accumulators out of the kh/kw/c loops, like tiling.py's matmul recipe; the
script is vectorize.py's, which applies these tiles.
"""
from __future__ import annotations

import dataclasses

from mlir import ir

from polyblocks_jax.passes.tiling import Hardware

_MAX_INPUT_CHANNELS = 32  # input channels per step: bounds the unrolled outer products


@dataclasses.dataclass(frozen=True)
class ConvTiles:
    width: int      # output pixels along W held in registers
    channels: int   # output channels (vector lanes) per pixel
    reduce: int     # input channels per step (1 for depthwise)


def choose_conv_tiles(out_width: int, out_channels: int, in_channels: int, elem_bytes: int,
                      hw: Hardware, depthwise: bool = False) -> ConvTiles | None:
    """Tiles for an NHWC convolution, or None when the channels do not fill a vector.

    Two vectors of channels when they divide the channel count; as many pixels as leave
    registers for the kernel vectors and one broadcast input element; input channels: the
    largest divisor up to a bound (each is one unrolled outer product per pixel).
    """
    lanes = hw.vector_bits // (8 * elem_bytes)
    vectors = 2 if out_channels % (2 * lanes) == 0 else 1 if out_channels % lanes == 0 else 0
    if not vectors:
        return None
    free = hw.vector_registers - vectors - 1
    width = _largest_divisor(out_width, max(1, free // vectors))
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
