"""stablehlo.convolution in full generality, as linalg on tensors.

Every convolution is first brought to one internal layout: input (N, S..., C),
kernel (S..., I, O), result (N, S..., O), with linalg.transpose where the program's
dimension numbers differ. Padding (negative too) and lhs dilation are materialized
on the input (a zero-filled tensor with the input inserted at a stride, then cropped),
window reversal on the kernel. What is left is a plain strided, rhs-dilated
convolution: a linalg named op where one exists (later tiling and vectorization
match those), a linalg.generic for feature groups, batch groups and odd dtypes.
A transposed convolution whose kernel is as large as its lhs dilation (each output pixel
reads one tap) is instead a matmul per output residue, with no dilated input.
"""
from __future__ import annotations

import dataclasses

from jaxlib.mlir import ir as jir
from jaxlib.mlir.dialects import stablehlo
from mlir import ir
from mlir.dialects import arith, linalg, tensor

from polyblocks_jax.dtypes import DTYPES, DType
from polyblocks_jax.stablehlo_import import builders, layout, reader, slices
from polyblocks_jax.stablehlo_import.convert import convert_value
from polyblocks_jax.stablehlo_import.registry import converts
from polyblocks_jax.stablehlo_import.types import element_type

# Named ops per spatial rank, all in the internal layout.
_CONV = {1: linalg.conv_1d_nwc_wcf, 2: linalg.conv_2d_nhwc_hwcf, 3: linalg.conv_3d_ndhwc_dhwcf}
_DEPTHWISE = {1: linalg.depthwise_conv_1d_nwc_wc, 2: linalg.depthwise_conv_2d_nhwc_hwc,
              3: linalg.depthwise_conv_3d_ndhwc_dhwc}
_DEPTHWISE_MULT = {1: linalg.depthwise_conv_1d_nwc_wcm, 2: linalg.depthwise_conv_2d_nhwc_hwcm,
                   3: linalg.depthwise_conv_3d_ndhwc_dhwcm}


@dataclasses.dataclass(frozen=True)
class _Window:
    """The convolution's attributes as plain Python, layouts as permutations to the internal one."""
    input_perm: list[int]     # internal dim i is the program's dim input_perm[i]
    kernel_perm: list[int]
    result_perm: list[int]
    strides: list[int]
    padding: list[tuple[int, int]]
    lhs_dilation: list[int]
    rhs_dilation: list[int]
    reversal: list[bool]
    groups: int               # feature_group_count
    batch_groups: int         # batch_group_count

    @property
    def rank(self) -> int:
        return len(self.strides)


def _read_window(op) -> _Window:
    dims = stablehlo.ConvDimensionNumbers(op.attr("dimension_numbers"))
    rank = len(dims.input_spatial_dimensions)

    def ints(name: str, default: int) -> list[int]:
        return reader.i64_list(op.attr(name)) or [default] * rank

    pads = reader.i64_list(op.attr("padding")) or [0] * (2 * rank)  # (lo, hi) per spatial dim

    def count(name: str) -> int:
        attr = op.attr(name)
        return jir.IntegerAttr(attr).value if attr is not None else 1

    return _Window(
        input_perm=[dims.input_batch_dimension, *dims.input_spatial_dimensions,
                    dims.input_feature_dimension],
        kernel_perm=[*dims.kernel_spatial_dimensions, dims.kernel_input_feature_dimension,
                     dims.kernel_output_feature_dimension],
        result_perm=[dims.output_batch_dimension, *dims.output_spatial_dimensions,
                     dims.output_feature_dimension],
        strides=ints("window_strides", 1),
        padding=list(zip(pads[0::2], pads[1::2])),
        lhs_dilation=ints("lhs_dilation", 1),
        rhs_dilation=ints("rhs_dilation", 1),
        reversal=[bool(b) for b in ints("window_reversal", 0)],
        groups=count("feature_group_count"),
        batch_groups=count("batch_group_count"))


@converts("stablehlo.convolution")
def convolution(cx, op):
    win = _read_window(op)
    lhs_spec, rhs_spec = op.operand_specs
    result = op.result_specs[0]
    if (lhs_spec.dtype.is_float or rhs_spec.dtype.is_float) and not result.dtype.is_float:
        raise op.unsupported(f"float operands with an integer result ({lhs_spec.dtype.name}, "
                             f"{rhs_spec.dtype.name} -> {result.dtype.name})")
    if 0 in result.shape:
        return [builders.empty(result)]
    acc = _accumulator(result.dtype)
    lhs = layout.transpose(op.operands[0], win.input_perm)
    spatial = [d for d, flip in enumerate(win.reversal) if flip]
    rhs = layout.reverse(layout.transpose(op.operands[1], win.kernel_perm), spatial)
    out_shape = [result.shape[d] for d in win.result_perm]
    taps = _subpixel_taps(win, builders.shape_of(lhs), builders.shape_of(rhs), out_shape)
    if taps is not None and {lhs_spec.dtype.name, rhs_spec.dtype.name, result.dtype.name} == {"f32"}:
        out = _subpixel(lhs, rhs, out_shape, win, taps)
    else:
        init = builders.filled(builders.splat(0, element_type(acc)), out_shape)
        out = convert_value(_convolve(_pad_and_dilate(lhs, win), rhs, init, win, op), acc, result.dtype)
    return [layout.transpose(out, _inverse(win.result_perm))]


def _subpixel_taps(win: _Window, lhs: list[int], rhs: list[int], out: list[int]) -> list[list[int]] | None:
    """Per spatial dim, the kernel tap each output residue (mod the lhs dilation) reads, when
    the convolution is a transposed one whose kernel is as large as its stride (a UNet's 2x2
    upsampling) and whose low padding is ``s - 1``: output ``r + s*i`` then reads dilated
    input ``r + t + s*i - (s - 1)``, nonzero for tap ``t = s - 1 - r`` alone, which is input
    ``i``. None otherwise."""
    if win.rank != 2 or win.groups != 1 or win.batch_groups != 1 or set(win.strides + win.rhs_dilation) != {1}:
        return None
    taps = []
    for d, s in enumerate(win.lhs_dilation):
        low, size = win.padding[d][0], lhs[1 + d]
        if s == 1 or rhs[d] != s or out[1 + d] != s * size or low != s - 1:
            return None
        taps.append([s - 1 - r for r in range(s)])
    return taps


def _subpixel(lhs: ir.Value, rhs: ir.Value, out_shape: list[int], win: _Window, taps: list[list[int]]) -> ir.Value:
    """The transposed convolution as one matmul per output residue, (N*H*W x C) @ (C x F)
    into every s-th pixel of an ``out_shape`` tensor (each pixel written once: no fill): no
    dilated input, none of its zeros multiplied (3/4 of the FLOPs of a 2x2 upsampling)."""
    n, h, w, c = builders.shape_of(lhs)
    f = builders.shape_of(rhs)[-1]
    pixels = layout.collapse(lhs, [[0, 1, 2], [3]], [n * h * w, c])
    (sh, sw), out = win.lhs_dilation, tensor.EmptyOp(out_shape, builders.elem_type_of(lhs)).result
    for rh in range(sh):
        for rw in range(sw):
            kernel = slices.extract_slice(rhs, [1, 1, c, f], [taps[0][rh], taps[1][rw], 0, 0])
            zeros = builders.filled(builders.splat(0, builders.elem_type_of(lhs)), [n * h * w, f])
            product = linalg.matmul(pixels, layout.collapse(kernel, [[0, 1, 2], [3]], [c, f]), outs=[zeros])
            out = slices.insert_slice(layout.expand(product, [[0, 1, 2], [3]], [n, h, w, f]), out,
                                      [0, rh, rw, 0], [1, sh, sw, 1])
    return out


def _accumulator(dtype: DType) -> DType:
    """Half-precision results accumulate in f32 and are rounded once, as XLA CPU does."""
    return DTYPES["f32"] if dtype.is_float and dtype.bits == 16 else dtype


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _pad_and_dilate(x: ir.Value, win: _Window) -> ir.Value:
    """Input (N, S..., C) with lhs dilation's interior zeros and edge padding (negative too)."""
    low = [0, *[lo for lo, _ in win.padding], 0]
    high = [0, *[hi for _, hi in win.padding], 0]
    interior = [0, *[d - 1 for d in win.lhs_dilation], 0]
    return slices.pad(x, 0, low, high, interior)


def _convolve(lhs: ir.Value, rhs: ir.Value, init: ir.Value, win: _Window, op) -> ir.Value:
    """The strided, rhs-dilated convolution in the internal layout, accumulated into ``init``."""
    lhs_dt, rhs_dt = op.operand_specs[0].dtype, op.operand_specs[1].dtype
    # Named ops extend narrower operands as signed: exact unless an unsigned operand widens.
    named = not lhs_dt.is_bool and not (
        (lhs_dt.is_unsigned or rhs_dt.is_unsigned)
        and {lhs_dt, rhs_dt} != {op.result_specs[0].dtype})
    kernel_in = builders.shape_of(rhs)[-2]
    channels = builders.shape_of(lhs)[-1]
    if named and win.batch_groups == 1 and win.rank == 1 and (win.groups == 1 or kernel_in == 1):
        return _as_2d(lhs, rhs, init, win, op)
    attrs = dict(strides=win.strides, dilations=win.rhs_dilation)
    if named and win.batch_groups == 1 and win.groups == 1:
        return _CONV[win.rank](lhs, rhs, outs=[init], **attrs)
    if named and win.batch_groups == 1 and win.groups == channels and kernel_in == 1:
        return _depthwise(lhs, rhs, init, win, attrs)
    return _generic_conv(lhs, rhs, init, win, op)


def _as_2d(lhs: ir.Value, rhs: ir.Value, init: ir.Value, win: _Window, op) -> ir.Value:
    """A 1-D convolution as a 2-D one of height 1, which the tiling and vectorization of 2-D
    convolutions take (the 1-D named ops stayed scalar loops: 65 times XLA's time)."""
    unit = [[0, 1], [2], [3]]  # a unit dim before the first

    def lift(value: ir.Value, kernel: bool = False) -> ir.Value:
        a, b, c = builders.shape_of(value)
        return layout.expand(value, unit, [1, a, b, c] if kernel else [a, 1, b, c])
    flat = dataclasses.replace(win, strides=[1, *win.strides], rhs_dilation=[1, *win.rhs_dilation])
    out = _convolve(lift(lhs), lift(rhs, kernel=True), lift(init), flat, op)
    return layout.collapse(out, unit, builders.shape_of(init))


def _depthwise(lhs: ir.Value, rhs: ir.Value, init: ir.Value, win: _Window, attrs: dict) -> ir.Value:
    """Feature groups of one input channel each: kernel (S..., 1, C*M) read as (S..., C, M)."""
    channels = builders.shape_of(lhs)[-1]
    kernel = _merge_last(rhs)  # (S..., C*M)
    if builders.shape_of(kernel)[-1] == channels:
        return _DEPTHWISE[win.rank](lhs, kernel, outs=[init], **attrs)
    out = _DEPTHWISE_MULT[win.rank](lhs, _split_last(kernel, channels),
                                    outs=[_split_last(init, channels)], **attrs)
    return _merge_last(out)


def _generic_conv(lhs: ir.Value, rhs: ir.Value, init: ir.Value, win: _Window, op) -> ir.Value:
    """Any feature or batch grouping (at most one of them > 1) as one linalg.generic.

    Loops (n, o_s..., g, og, r_s..., i); input channel g*I+i, input batch g*N'+n and
    result feature g*Og+og, with the kernel and result viewed as (..., g, Og).
    """
    k = win.rank
    groups = win.groups * win.batch_groups
    batch = builders.shape_of(init)[0]
    kernel_in = builders.shape_of(rhs)[-2]
    d = [ir.AffineDimExpr.get(j) for j in range(2 * k + 4)]
    n, outs, g, og, window, i = d[0], d[1:k + 1], d[k + 1], d[k + 2], d[k + 3:2 * k + 3], d[-1]
    lhs_map = [g * batch + n if win.batch_groups > 1 else n,
               *[o * s + r * dil for o, r, s, dil in zip(outs, window, win.strides, win.rhs_dilation)],
               g * kernel_in + i if win.groups > 1 else i]
    maps = [ir.AffineMap.get(len(d), 0, m) for m in (lhs_map, [*window, i, g, og], [n, *outs, g, og])]
    iterators = ["parallel"] * (k + 3) + ["reduction"] * (k + 1)
    (result,) = builders.generic([lhs, _split_last(rhs, groups)], [_split_last(init, groups)],
                                 maps, iterators, _mac_body(op))
    return _merge_last(result)


def _mac_body(op):
    """acc + lhs * rhs on scalars, operands converted to the accumulator type first."""
    lhs_dt, rhs_dt = op.operand_specs[0].dtype, op.operand_specs[1].dtype
    acc_dt = _accumulator(op.result_specs[0].dtype)

    def body(a: ir.Value, b: ir.Value, acc: ir.Value) -> list[ir.Value]:
        a, b = convert_value(a, lhs_dt, acc_dt), convert_value(b, rhs_dt, acc_dt)
        if isinstance(acc.type, ir.FloatType):
            return [arith.addf(acc, arith.mulf(a, b))]
        if lhs_dt.is_bool:  # a pred convolution: or of ands
            return [arith.ori(acc, arith.andi(a, b))]
        return [arith.addi(acc, arith.muli(a, b))]
    return body


def _split_last(value: ir.Value, groups: int) -> ir.Value:
    """(..., G*M) -> (..., G, M)."""
    shape = builders.shape_of(value)
    return layout.expand(value, _last_pair(len(shape) - 1), [*shape[:-1], groups, shape[-1] // groups])


def _merge_last(value: ir.Value) -> ir.Value:
    """(..., G, M) -> (..., G*M)."""
    shape = builders.shape_of(value)
    return layout.collapse(value, _last_pair(len(shape) - 2), [*shape[:-2], shape[-2] * shape[-1]])


def _last_pair(leading: int) -> list[list[int]]:
    """Reassociation keeping ``leading`` dims and pairing the two after them."""
    return [[j] for j in range(leading)] + [[leading, leading + 1]]
