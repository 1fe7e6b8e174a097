"""Register tiling and vectorization of 2-D NHWC convolutions, along channels.

``choose_conv_tiles`` is the cost model: a register tile of output pixels along W by a few
vectors of output channels, accumulated over a block of input channels; of the tiles that
fit the registers, the one with the fewest estimated cycles per FMA
(``tiling.cycles_per_fma``: FMA throughput, loads, and the latency each chain waits on). The
transform script tiles every loop to that block (kernel rows and columns to one), decomposes
the 2-D convolution into a 1-D one, vectorizes it (outer products over input channels) and
hoists the accumulators out of the kh/kw/c loops, like tiling.py's matmul recipe; the script
is the host's vectorize stage's (cpu/vectorize.py), which applies these tiles.

A 1x1 convolution with unit strides is a matmul on the collapsed image, and one whose
windows tile the image or whose weights outgrow half of L2 a matmul on its im2col rows (for
a group of images at a time where the whole batch's rows would be large), or, in one
dimension, a matmul per kernel tap on slices of each image's row:
``convs_to_matmuls`` (a stage before tiling) hands them to the matmul tiling. There too, a
direct convolution whose output channels fill no vector (an image's 3 colour channels, the
input gradient of a network's first convolution) gets zero kernel columns up to a width
that does, and its result is the slice of the real channels.
"""
from __future__ import annotations

import dataclasses
import math

from mlir import ir
from mlir.dialects import arith, linalg, scf, tensor

from polyblocks_jax.options import Options
from polyblocks_jax.passes.tiling import Hardware, cycles_per_fma
from polyblocks_jax.passes.transform import collapse, reassociation, walk
from polyblocks_jax.passes.zero_start import zero_filled
from polyblocks_jax.tensor_ir import builders, slices

POOLINGS = ("linalg.pooling_nhwc_max", "linalg.pooling_nhwc_min", "linalg.pooling_nhwc_sum")
# Input channels per step, each an unrolled outer product: more unroll no faster, and the
# code (and its compile time) grows with it.
_MAX_INPUT_CHANNELS = 8
_MAX_VECTORS = 4          # vectors of output channels per pixel
_MAX_TAPS = 49            # kernel taps an im2col gathers each input pixel for (7 x 7)
# Gathered rows alive at once (beyond, groups of images in a loop): more took arena memory
# for no speed (ResNet-18 at batch 8: 7.2 MB of them, as much as all its other intermediates),
# unless the weights are larger still (see ``_as_matmul``).
_IM2COL_BYTES = 2 << 20


@dataclasses.dataclass(frozen=True)
class ConvTiles:
    width: int      # output pixels along W held in registers
    channels: int   # output channels (vector lanes) per pixel
    reduce: int     # input channels per step (1 for depthwise)


def choose_conv_tiles(out_width: int, out_channels: int, in_channels: int, elem_bytes: int,
                      hw: Hardware, depthwise: bool = False, pooling: bool = False) -> ConvTiles | None:
    """Tiles for an NHWC convolution (a ``pooling``: depthwise, without kernel), or None when
    the channels do not fill a vector.

    Pixels (dividing the width) by vectors (dividing the channels), with registers left for
    the kernel vectors, one input operand and the loads LLVM schedules ahead in the unrolled
    input channels (an eighth of the registers: without them the accumulators spill); input
    channels: the largest divisor up to a bound (each is one unrolled outer product per pixel).
    A pooling loads one input vector per add whatever the tile (no kernel vector serves its
    pixels); of its tiles of equal cost, the most vectors of channels: each pixel's contiguous
    channels read in one go, not a cache line of each of many pixels apart.
    """
    lanes = hw.lanes(elem_bytes, out_channels)
    registers = hw.vector_registers - hw.vector_registers // 8
    tiles = [(width, vectors) for vectors in range(1, _MAX_VECTORS + 1) if out_channels % (vectors * lanes) == 0
             for width in range(1, out_width + 1) if out_width % width == 0
             and width * vectors + vectors + 1 <= registers]
    if not tiles:
        return None
    if pooling:
        width, vectors = min(tiles, key=lambda t: (cycles_per_fma(*t, True, kernel=False), -t[1], -t[0]))
    else:
        width, vectors = min(tiles, key=lambda t: (cycles_per_fma(*t, depthwise), -t[0] * t[1]))
    reduce = 1 if depthwise else _largest_divisor(in_channels, _MAX_INPUT_CHANNELS)
    return ConvTiles(width, vectors * lanes, reduce)


def _largest_divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def loop_tiles(op: ir.Operation, hw: Hardware) -> tuple[tuple[int, ...], frozenset[int]] | None:
    """Tile size per loop of an f32 2-D NHWC convolution or pooling and its reduction loops,
    or None. A pooling is a depthwise convolution without weights (its second operand only
    gives the window its shape)."""
    depthwise = op.name == "linalg.depthwise_conv_2d_nhwc_hwc" or op.name in POOLINGS
    if op.name != "linalg.conv_2d_nhwc_hwcf" and not depthwise:
        return None
    types = [ir.RankedTensorType(v.type) for v in op.operands]
    valued = [types[0], types[2]] if op.name in POOLINGS else types
    if any(not isinstance(t.element_type, ir.F32Type) for t in valued):
        return None
    _, _, ow, f = types[2].shape
    c = types[0].shape[-1]
    t = choose_conv_tiles(ow, f, c, 4, hw, depthwise, op.name in POOLINGS)
    if t is None:
        return None
    # Loops: conv (n, oh, ow, f, kh, kw, c); depthwise (n, oh, ow, c, kh, kw).
    if depthwise:
        return (1, 1, t.width, t.channels, 1, 1), frozenset({4, 5})
    return (1, 1, t.width, t.channels, 1, 1, t.reduce), frozenset({4, 5, 6})


def convs_to_matmuls(module: ir.Module, options: Options, hw: Hardware) -> None:
    """Hand to the matmul tiling the f32 NHWC convolutions it computes better than the direct
    convolution: a 1x1 convolution with unit strides as a matmul on the collapsed image,
    (N*H*W x C) @ (C x F); any other whose weights exceed half of L2 (``im2col_pays``) as a
    matmul on its gathered input rows, im2col (N*OH*OW x KH*KW*C) @ (KH*KW*C x F). A direct
    convolution whose output channels fill no vector computes ``padded_channels`` of them."""
    for op in list(walk(module.operation)):
        if not _is_static_f32_conv(op):
            continue
        channels = _shape(op.operands[1])[3]
        padded = padded_channels(channels, hw)
        if _is_pointwise(op) or im2col_pays(op, hw):
            with op.location:
                result = _as_matmul(op)
        elif padded != channels:
            with op.location:
                result = _with_channels(op, padded)
        else:
            continue
        op.results[0].replace_all_uses_with(result)
        op.erase()


def padded_channels(channels: int, hw: Hardware) -> int:
    """The output channels a direct f32 convolution computes: ``channels`` where a vector
    width divides them, else the fewest vectors' worth (the narrowest width on a tie).
    Without vectors the convolution would run as scalar loops."""
    if channels % hw.lanes(4, channels) == 0:
        return channels
    widths = {-(-channels // lanes) * lanes for lanes in (4, 8, 16) if lanes <= hw.lanes(4)}
    return min(widths, key=lambda width: (width // hw.lanes(4, width), width))


def _with_channels(op: ir.Operation, channels: int) -> ir.Value:
    """The convolution ``op`` computed for ``channels`` output channels (kernel columns and
    accumulators past its own zero), sliced back to its own."""
    image, kernel, init = op.operands
    n, oh, ow, f = _shape(init)
    element = ir.RankedTensorType(init.type).element_type
    with ir.InsertionPoint(op):
        wide = [0, 0, 0, channels - f]
        kernel = slices.pad(kernel, 0.0, [0] * 4, wide, [0] * 4)
        if zero_filled(init):
            init = builders.fill(arith.constant(element, 0.0), tensor.EmptyOp([n, oh, ow, channels], element).result)
        else:
            init = slices.pad(init, 0.0, [0] * 4, wide, [0] * 4)
        conv = linalg.conv_2d_nhwc_hwcf(image, kernel, outs=[init], strides=_ints(op, "strides"),
                                        dilations=_ints(op, "dilations"))
        return slices.extract_slice(conv, [n, oh, ow, f], [0] * 4)


def im2col_pays(op: ir.Operation, hw: Hardware) -> bool:
    """Whether a convolution is cheaper as im2col and a matmul than as a direct convolution.

    The direct convolution's register tile holds a few pixels by a few vectors of output
    channels and steps through all the weights for every tile of pixels: weights beyond half
    of L2 then stream from L3 for a few FMAs each (ResNet-18's 14x14x128 to 4x4x512 stages
    ran at a third to a half of XLA's speed). The matmul tiling packs cache blocks of them
    once per block of rows instead; the gathered rows cost one copy of KH*KW times the
    input, small against the F/2 FLOPs each of their elements then takes part in. Windows
    that overlap gather each pixel once per tap: a large kernel stays direct (memory).
    Windows that tile the image (a ViT's patch embedding) are gathered by one copy of the
    input, whatever the weights' size: the direct convolution would read each tap's pixels
    with a stride of the kernel width, a few input channels at a time."""
    window = _Window.of(op)
    if window.patchify:
        return True
    return _tensor_bytes(op.operands[1]) > hw.l2_bytes // 2 and math.prod(window.kernel) <= _MAX_TAPS


@dataclasses.dataclass(frozen=True)
class _Window:
    """What im2col reads of a convolution: kernel taps, strides, dilations, output pixels."""
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    out: tuple[int, int]

    @staticmethod
    def of(conv: ir.Operation) -> "_Window":
        kh, kw, _, _ = ir.RankedTensorType(conv.operands[1].type).shape
        _, oh, ow, _ = ir.RankedTensorType(conv.operands[2].type).shape
        return _Window((kh, kw), tuple(_ints(conv, "strides")), tuple(_ints(conv, "dilations")), (oh, ow))

    @property
    def patchify(self) -> bool:
        """Whether the windows tile the image: strides equal to the kernel, no dilation."""
        return self.strides == self.kernel and self.dilations == (1, 1)

    @property
    def one_row(self) -> bool:
        """Whether the windows read one row of the image (a 1-D convolution), not tiling it."""
        return self.kernel[0] == self.out[0] == 1 and not self.patchify


def _as_matmul(op: ir.Operation) -> ir.Value:
    """The convolution ``op`` as matmuls: on the whole batch, or, where its gathered rows
    would outgrow ``_IM2COL_BYTES`` and the weights, in a loop over groups of images. Each
    group streams all the weights again (a matmul's packed panels are the group's): rows up
    to the weights' size keep that traffic no larger than the rows' own."""
    image, kernel, init = op.operands
    n, _, _, c = ir.RankedTensorType(image.type).shape
    kh, kw, _, f = ir.RankedTensorType(kernel.type).shape
    window = _Window.of(op)
    with ir.InsertionPoint(op):
        if window.one_row:
            return _tap_matmuls(image, kernel, init, window)
        weights = collapse(kernel, [kh * kw * c, f], [[0, 1, 2], [3]])
        if _is_pointwise(op):
            return _matmul(collapse(image, [math.prod(_shape(image)[:3]), c], [[0, 1, 2], [3]]), weights, init)
        image_bytes = math.prod(window.out) * kh * kw * c * 4  # one image's gathered rows (f32)
        bound = max(_IM2COL_BYTES, _tensor_bytes(kernel))
        group = max(d for d in range(1, n + 1) if n % d == 0 and (d == 1 or d * image_bytes <= bound))
        if group == n:
            return _matmul(_im2col(image, window), weights, init)
        return _grouped_matmuls(image, weights, init, window, group)


def _grouped_matmuls(image: ir.Value, weights: ir.Value, init: ir.Value, window: _Window,
                     group: int) -> ir.Value:
    """``_matmul`` of the im2col rows of ``group`` images at a time, in an scf.for over the
    batch: the rows of one group alive at once (UNet-128's 32x32x128 convolutions gathered
    38 MB for a batch of 8)."""
    index = ir.IndexType.get()
    bound, step = (arith.constant(index, v) for v in (_shape(image)[0], group))
    loop = scf.ForOp(arith.constant(index, 0), bound, step, [init])
    with ir.InsertionPoint(loop.body):
        (out,) = loop.inner_iter_args
        images = _batch_slice(image, loop.induction_variable, group)
        part = _matmul(_im2col(images, window), weights, _batch_slice(out, loop.induction_variable, group))
        scf.YieldOp([_batch_insert(part, out, loop.induction_variable)])
    return loop.results[0]


def _tap_matmuls(image: ir.Value, kernel: ir.Value, init: ir.Value, window: _Window) -> ir.Value:
    """A 1-D convolution as one matmul per kernel tap, in a loop over the images: tap t's
    rows are a slice of the image's row (strided as the windows), not a gathered copy, and
    the taps' products accumulate in turn. A zero ``init`` becomes a fill of each image's
    slice, which its first k tile then never reads (zero_start.py): the loop writes every
    element. Where the image is the input zero-padded along its row, each tap reads the
    input's rows it multiplies by more than zeros, a tap that covers every output row first.
    No rows are gathered per image, and neither the padded copy nor the fills remain."""
    n, _, _, c = _shape(image)
    (_, kw), (_, ow), (_, sw), (_, dw) = window.kernel, window.out, window.strides, window.dilations
    element = ir.RankedTensorType(image.type).element_type
    source, pad = _unpadded_row(image)
    if source is None:
        source = collapse(image, [n, _shape(image)[2], c], [[0], [1, 2], [3]])
    # (tap, the row of ``source`` its first window reads (negative: in the padding), the
    # output rows [lo, hi) whose windows reach the input)
    taps = [(t, t * dw - pad, _reaching(t * dw - pad, sw, ow, _shape(source)[1])) for t in range(kw)]
    taps.sort(key=lambda tap: tap[2] != (0, ow))
    unfilled = _without_zero_fill(init)
    index = ir.IndexType.get()
    loop = scf.ForOp(arith.constant(index, 0), arith.constant(index, n), arith.constant(index, 1),
                     [init if unfilled is None else unfilled])
    with ir.InsertionPoint(loop.body):
        (out,) = loop.inner_iter_args
        image_index = loop.induction_variable
        f = _shape(kernel)[3]
        at = [image_index, 0, 0, 0]
        acc = slices.extract_slice(out, [1, 1, ow, f], at, shape=[ow, f])
        if unfilled is not None:
            acc = builders.fill(arith.constant(element, 0.0), acc)
        for tap, first, (lo, hi) in taps:
            if lo < hi:
                rows = slices.extract_slice(source, [1, hi - lo, c], [image_index, first + lo * sw, 0], [1, sw, 1],
                                            shape=[hi - lo, c])
                weights = slices.extract_slice(kernel, [1, 1, c, f], [0, tap, 0, 0], shape=[c, f])
                acc = _accumulate_rows(rows, weights, acc, lo)
        scf.YieldOp([slices.insert_slice(acc, out, at, sizes=[1, 1, ow, f])])
    return loop.results[0]


def _reaching(first: int, stride: int, out_rows: int, rows: int) -> tuple[int, int]:
    """The output rows [lo, hi) whose window tap reads one of ``rows``, the first window's
    reading row ``first``."""
    return max(0, -(first // stride)), min(out_rows, (rows - 1 - first) // stride + 1)


def _accumulate_rows(rows: ir.Value, weights: ir.Value, acc: ir.Value, lo: int) -> ir.Value:
    """``acc`` with ``rows @ weights`` added to its rows from ``lo``."""
    count, f = _shape(rows)[0], _shape(weights)[1]
    if (lo, count) == (0, _shape(acc)[0]):
        return linalg.matmul(rows, weights, outs=[acc])
    product = linalg.matmul(rows, weights, outs=[slices.extract_slice(acc, [count, f], [lo, 0])])
    return slices.insert_slice(product, acc, [lo, 0])


def _unpadded_row(image: ir.Value) -> tuple[ir.Value | None, int]:
    """The (N, W, C) input that the importer zero-padded along W into the 1-D ``image`` (an
    insert into a zero fill, given a unit H), and the padding before it; else (None, 0)."""
    expand = image.owner
    if not isinstance(expand, ir.OpView) or expand.name != "tensor.expand_shape" or _shape(image)[1] != 1:
        return None, 0
    insert = expand.operands[0].owner
    if not isinstance(insert, ir.OpView) or insert.name != "tensor.insert_slice" or len(insert.operands) != 2 \
            or not zero_filled(insert.operands[1]):
        return None, 0
    source, padded = insert.operands
    offsets, strides = (list(ir.DenseI64ArrayAttr(insert.attributes[f"static_{name}"]))
                        for name in ("offsets", "strides"))
    n, _, c = _shape(source)
    if _shape(padded) != [n, _shape(image)[2], c] or strides != [1, 1, 1] or offsets[0] != 0 or offsets[2] != 0:
        return None, 0
    return source, offsets[1]


def _without_zero_fill(init: ir.Value) -> ir.Value | None:
    """``init`` (a zero fill, through the importer's reshapes) made of the fill's empty tensor
    instead, the fill erased; None where it is not one (or has other uses)."""
    value = init
    while isinstance(value.owner, ir.OpView) and value.owner.name in ("tensor.expand_shape", "tensor.collapse_shape"):
        value = value.owner.operands[0]
    if not zero_filled(value) or len(list(value.uses)) != 1:
        return None
    fill, empty = value.owner, value.owner.operands[1]
    was_fill = init == value
    value.replace_all_uses_with(empty)
    fill.erase()
    return empty if was_fill else init


def _matmul(rows: ir.Value, weights: ir.Value, init: ir.Value) -> ir.Value:
    """``rows @ weights`` into the NHWC ``init``, through their collapsed shapes."""
    n, oh, ow, f = _shape(init)
    acc = collapse(init, [n * oh * ow, f], [[0, 1, 2], [3]])
    product = linalg.matmul(rows, weights, outs=[acc])
    return tensor.ExpandShapeOp(init.type, product, reassociation([[0, 1, 2], [3]]),
                                [], ir.DenseI64ArrayAttr.get([n, oh, ow, f])).result


def _batch_slice(value: ir.Value, start: ir.Value, count: int) -> ir.Value:
    """Images ``start`` to ``start + count`` of the NHWC ``value``."""
    shape = [count, *_shape(value)[1:]]
    element = ir.RankedTensorType(value.type).element_type
    return tensor.extract_slice(ir.RankedTensorType.get(shape, element), value, [start], [], [],
                                _batch_offsets(len(shape)), shape, [1] * len(shape))


def _batch_insert(part: ir.Value, into: ir.Value, start: ir.Value) -> ir.Value:
    """``part`` inserted into ``into`` from image ``start`` on."""
    shape = _shape(part)
    return tensor.insert_slice(part, into, [start], [], [], _batch_offsets(len(shape)), shape, [1] * len(shape))


def _batch_offsets(rank: int) -> list[int]:
    """Static offsets of a slice at a dynamic image index: the first dim dynamic, others 0."""
    return [ir.ShapedType.get_dynamic_size(), *[0] * (rank - 1)]


def _shape(value: ir.Value) -> list[int]:
    return list(ir.RankedTensorType(value.type).shape)


def _im2col(image: ir.Value, window: _Window) -> ir.Value:
    """The (N*OH*OW, KH*KW*C) rows of a convolution's (padded) input ``image``."""
    n, h, w, c = _shape(image)
    (kh, kw), (oh, ow) = window.kernel, window.out
    element = ir.RankedTensorType(image.type).element_type
    if window.patchify:
        # Windows that tile the image (a ViT's patch embedding): each row is one patch, a
        # reshape of the image, then one copy swapping the patch rows and columns.
        if (h, w) != (oh * kh, ow * kw):
            image = tensor.extract_slice(ir.RankedTensorType.get([n, oh * kh, ow * kw, c], element), image,
                                         [], [], [], [0] * 4, [n, oh * kh, ow * kw, c], [1] * 4)
        flat = collapse(image, [n, oh * kh, ow * kw * c], [[0], [1], [2, 3]])
        blocks = tensor.ExpandShapeOp(ir.RankedTensorType.get([n, oh, kh, ow, kw * c], element), flat,
                                      reassociation([[0], [1, 2], [3, 4]]),
                                      [], ir.DenseI64ArrayAttr.get([n, oh, kh, ow, kw * c])).result
        rows = _copy(blocks, tensor.EmptyOp([n, oh, ow, kh, kw * c], element).result, [0, 1, 3, 2, 4])
        return collapse(rows, [n * oh * ow, kh * kw * c], [[0, 1, 2], [3, 4]])
    # Otherwise one generic over every tap: row (n, oh, ow) column (kh, kw, c) reads the
    # image at (n, oh * sh + kh * dh, ow * sw + kw * dw, c); scalar loops, as the copies per
    # tap it replaces ended up (canonicalization folded them into slices, bufferization then
    # copied each tap in a parallel region of its own), in less code to compile.
    (sh, sw), (dh, dw) = window.strides, window.dilations
    d = [ir.AffineDimExpr.get(i) for i in range(6)]
    window_map = ir.AffineMap.get(6, 0, [d[0], d[1] * sh + d[3] * dh, d[2] * sw + d[4] * dw, d[5]])
    rows = _copy_through(image, tensor.EmptyOp([n, oh, ow, kh, kw, c], element).result, window_map)
    return collapse(rows, [n * oh * ow, kh * kw * c], [[0, 1, 2], [3, 4, 5]])


def _copy(source: ir.Value, dest: ir.Value, permutation: list[int] | None = None) -> ir.Value:
    """``source`` copied into ``dest`` by an elementwise linalg.generic: ``dest[d]`` =
    ``source[d[permutation]]`` (the identity by default)."""
    rank = ir.RankedTensorType(source.type).rank
    return _copy_through(source, dest, ir.AffineMap.get_identity(rank) if permutation is None
                         else ir.AffineMap.get_permutation(permutation))


def _copy_through(source: ir.Value, dest: ir.Value, read: ir.AffineMap) -> ir.Value:
    """``dest`` filled by a linalg.generic: ``dest[d]`` = ``source[read(d)]``."""
    rank = ir.RankedTensorType(dest.type).rank
    identity = ir.AffineMap.get_identity(rank)
    parallel = ir.Attribute.parse("#linalg.iterator_type<parallel>")
    copy = linalg.GenericOp([dest.type], [source], [dest],
                            ir.ArrayAttr.get([ir.AffineMapAttr.get(read), ir.AffineMapAttr.get(identity)]),
                            ir.ArrayAttr.get([parallel] * rank))
    element = ir.RankedTensorType(source.type).element_type
    block = copy.regions[0].blocks.append(element, element)
    with ir.InsertionPoint(block):
        linalg.YieldOp([block.arguments[0]])
    return copy.result


def _is_static_f32_conv(op: ir.Operation) -> bool:
    if op.name != "linalg.conv_2d_nhwc_hwcf":
        return False
    types = [ir.RankedTensorType(v.type) for v in op.operands]
    return all(isinstance(t.element_type, ir.F32Type) and t.has_static_shape for t in types)


def _is_pointwise(op: ir.Operation) -> bool:
    kernel = ir.RankedTensorType(op.operands[1].type)
    return list(kernel.shape[:2]) == [1, 1] and _ints(op, "strides") == [1, 1]


def _ints(op: ir.Operation, name: str) -> list[int]:
    return [int(v) for v in ir.DenseIntElementsAttr(op.attributes[name])] if name in op.attributes else [1, 1]


def _tensor_bytes(value: ir.Value) -> int:
    t = ir.RankedTensorType(value.type)
    return math.prod(t.shape) * t.element_type.width // 8
