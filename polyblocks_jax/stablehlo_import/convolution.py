"""stablehlo.convolution in full generality, as linalg on tensors.

Every convolution is first brought to one internal layout: input (N, S..., C),
kernel (S..., I, O), result (N, S..., O), with linalg.transpose where the program's
dimension numbers differ. Padding (negative too) and lhs dilation are materialized
on the input (a zero-filled tensor with the input inserted at a stride, then cropped),
window reversal on the kernel. What is left is a plain strided, rhs-dilated
convolution: a linalg named op where one exists (later tiling and vectorization
match those), a linalg.generic for feature groups, batch groups and odd dtypes.
A transposed convolution (lhs dilation, unit strides: the input gradient of a strided
convolution) is instead one plain convolution per output residue modulo the dilation, of
the undilated input with the kernel taps that residue reads: no dilated input, none of its
zeros multiplied (3/4 of the products at dilation 2 in 2-D).
"""
from __future__ import annotations

import dataclasses
import itertools

from jaxlib.mlir import ir as jir
from jaxlib.mlir.dialects import stablehlo
from mlir import ir
from mlir.dialects import arith, linalg, tensor

from polyblocks_jax.dtypes import DTYPES, DType
from polyblocks_jax.stablehlo_import import reader
from polyblocks_jax.tensor_ir import builders, layout, slices
from polyblocks_jax.stablehlo_import.convert import convert_value
from polyblocks_jax.stablehlo_import.registry import converts
from polyblocks_jax.tensor_ir.types import element_type

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
    lhs = layout.transpose(op.operands[0], win.input_perm)
    spatial = [d for d, flip in enumerate(win.reversal) if flip]
    rhs = layout.reverse(layout.transpose(op.operands[1], win.kernel_perm), spatial)
    out_shape = [result.shape[d] for d in win.result_perm]
    residues = _residues(win, builders.shape_of(lhs), builders.shape_of(rhs), out_shape)
    if residues is not None:
        out = _by_residues(lhs, rhs, out_shape, win, residues, op)
    else:
        out = _convolution(lhs, rhs, out_shape, win, op)
    return [layout.transpose(out, _inverse(win.result_perm))]


def _convolution(lhs: ir.Value, rhs: ir.Value, out_shape: list[int], win: _Window, op) -> ir.Value:
    """The convolution in the internal layout, of the result's dtype."""
    result, acc = op.result_specs[0].dtype, _accumulator(op.result_specs[0].dtype)
    init = builders.filled(builders.splat(0, element_type(acc)), out_shape)
    return convert_value(_convolve(_pad_and_dilate(lhs, win), rhs, init, win, op), acc, result)


@dataclasses.dataclass(frozen=True)
class _Residue:
    """The outputs ``r, r + s, ...`` (``count`` of them) of one spatial dim of a transposed
    convolution with lhs dilation ``s``: output ``r + s*m`` is the sum over ``j < taps`` of
    input ``m + j - pad[0]`` times kernel tap ``first + s*j``, a plain convolution."""
    r: int
    first: int
    taps: int
    count: int
    pad: tuple[int, int]


def _residues(win: _Window, lhs: list[int], rhs: list[int], out: list[int]) -> list[list[_Residue]] | None:
    """Per spatial dim, its output residues, when the convolution is a transposed one
    (lhs dilation, unit strides and rhs dilation); None otherwise."""
    if set(win.lhs_dilation) == {1} or set(win.strides + win.rhs_dilation) != {1}:
        return None
    dims = []
    for d, s in enumerate(win.lhs_dilation):
        low, size, kernel, outputs = win.padding[d][0], lhs[1 + d], rhs[d], out[1 + d]
        dims.append([])
        for r in range(min(s, outputs)):
            # Padded dilated position r + s*m + t is input element (r + s*m + t - low) / s.
            first = (low - r) % s
            taps = max(0, -(-(kernel - first) // s))
            offset = (r + first - low) // s
            count = -(-(outputs - r) // s)
            dims[-1].append(_Residue(r, first, taps, count, (-offset, offset + count + taps - 1 - size)))
    return dims


def _by_residues(lhs: ir.Value, rhs: ir.Value, out_shape: list[int], win: _Window,
                 residues: list[list[_Residue]], op) -> ir.Value:
    """The transposed convolution as one convolution per combination of residues, each
    written into every s-th output (no fill where every output has a tap)."""
    dtype = element_type(op.result_specs[0].dtype)
    whole = all(r.taps for dim in residues for r in dim)
    out = tensor.EmptyOp(out_shape, dtype).result if whole else builders.filled(builders.splat(0, dtype), out_shape)
    plain = dataclasses.replace(win, lhs_dilation=[1] * win.rank)
    c, f = builders.shape_of(rhs)[-2:]
    for combination in itertools.product(*residues):
        if not all(r.taps for r in combination):
            continue
        kernel = slices.extract_slice(rhs, [*(r.taps for r in combination), c, f],
                                      [*(r.first for r in combination), 0, 0],
                                      [*win.lhs_dilation, 1, 1])
        sub = dataclasses.replace(plain, padding=[r.pad for r in combination])
        part = _convolution(lhs, kernel, [out_shape[0], *(r.count for r in combination), f], sub, op)
        out = slices.insert_slice(part, out, [0, *(r.r for r in combination), 0], [1, *win.lhs_dilation, 1])
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
    # Named ops exist for 1 to 3 spatial dims only, and extend narrower operands as signed:
    # exact unless an unsigned operand widens.
    named = win.rank in _CONV and not lhs_dt.is_bool and not (
        (lhs_dt.is_unsigned or rhs_dt.is_unsigned)
        and {lhs_dt, rhs_dt} != {op.result_specs[0].dtype})
    kernel_in = builders.shape_of(rhs)[-2]
    channels = builders.shape_of(lhs)[-1]
    if not named:
        return _generic_conv(lhs, rhs, init, win, op)
    if win.rank == 1:
        return _as_2d(lhs, rhs, init, win, op)
    attrs = dict(strides=win.strides, dilations=win.rhs_dilation)
    if win.batch_groups == 1 and win.groups == 1:
        return _CONV[win.rank](lhs, rhs, outs=[init], **attrs)
    if win.batch_groups == 1 and win.groups == channels and kernel_in == 1:
        return _depthwise(lhs, rhs, init, win, attrs)
    return _by_groups(lhs, rhs, init, win, op)


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


def _by_groups(lhs: ir.Value, rhs: ir.Value, init: ir.Value, win: _Window, op) -> ir.Value:
    """Feature or batch groups (at most one of them > 1) as a loop over the groups, each a
    plain convolution of its slices, which the named op's tiling and vectorization take
    (one generic over every group stays scalar loops: 7 times XLA's time).

    Group g reads input channels g*I.. (feature groups) or input images g*N.. (batch groups),
    the kernel's and the result's features g*Og...
    """
    groups = win.groups * win.batch_groups
    lhs_shape, rhs_shape, out_shape = (builders.shape_of(v) for v in (lhs, rhs, init))
    kernel_in, features = rhs_shape[-2], out_shape[-1] // groups
    lhs_sizes = ([*lhs_shape[:-1], kernel_in] if win.groups > 1
                 else [out_shape[0], *lhs_shape[1:]])
    plain = dataclasses.replace(win, groups=1, batch_groups=1)
    # Each group fills its own slice of the result just before its nest loads it (from
    # cache): a fill of the whole result, written before the loop, was loaded back from
    # memory a group at a time.
    fill = init.owner if isinstance(init.owner, ir.OpView) and init.owner.operation.name == "linalg.fill" else None

    def group(g: ir.Value, carried: list[ir.Value]) -> list[ir.Value]:
        def at(size: int) -> ir.Value:
            return arith.muli(g, builders.index_constant(size))
        zeros = [0] * (win.rank + 1)
        lhs_offsets = [*zeros, at(kernel_in)] if win.groups > 1 else [at(out_shape[0]), *zeros]
        lhs_g = slices.extract_slice(lhs, lhs_sizes, lhs_offsets)
        rhs_g = slices.extract_slice(rhs, [*rhs_shape[:-1], features], [*zeros, at(features)])
        out_offsets = [*zeros, at(features)]
        init_g = slices.extract_slice(carried[0], [*out_shape[:-1], features], out_offsets)
        if fill is not None:
            init_g = builders.fill(fill.operands[0], init_g)
        part = _convolve(lhs_g, rhs_g, init_g, plain, op)
        return [slices.insert_slice(part, carried[0], out_offsets)]
    zero, one = builders.index_constant(0), builders.index_constant(1)
    start = fill.operands[1] if fill is not None else init
    result = builders.for_loop(zero, builders.index_constant(groups), one, [start], group)[0]
    if fill is not None and not list(init.uses):
        fill.operation.erase()
    return result


def _generic_conv(lhs: ir.Value, rhs: ir.Value, init: ir.Value, win: _Window, op) -> ir.Value:
    """A convolution of types no named op takes, with any feature or batch grouping (at most
    one of them > 1), as one linalg.generic.

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
