"""stablehlo.fft (FFT, IFFT, RFFT, IRFFT over the last 1 to 3 axes) as radix passes and matrix products.

XLA CPU calls an FFT library; we have none. A length whose prime factors are all small is
a Stockham FFT (fft_passes.py): radix-2/4 (and 3, 5, 7) butterfly passes, each one
elementwise generic, run on blocks of the batch that stay in cache. Other lengths become
products with small DFT matrices: a length n = n1 * n2 is a Cooley-Tukey step (DFTs of
length n1 across the rows, a twiddle product, DFTs of length n2), recursively, down to
lengths whose dense DFT matrix or passes are cheaper, the choice made by a cost that
weighs passes over memory against the products; a long prime length is Bluestein's
convolution, done by transforms of a power-of-two length.
The real transforms of an even length go through a complex one of half the length.
Every length works, and the pieces are ordinary matmuls, transposes and elementwise
generics on the (real, imaginary) parts, which the later stages tile, vectorize and
parallelize like any other. DFT matrices and twiddles are computed in float64 with their
exponents reduced modulo n, then rounded once to the part type.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from mlir import ir
from mlir.dialects import arith, linalg

from polyblocks_jax.dtypes import DType, TensorSpec
from polyblocks_jax.stablehlo_import import fft_passes, reader
from polyblocks_jax.tensor_ir import builders, layout, slices
from polyblocks_jax.stablehlo_import.complex_values import Pair, part_spec
from polyblocks_jax.stablehlo_import.registry import converts_complex

# The cost of a Cooley-Tukey step beyond those of its two DFTs, in the unit of the dense
# DFT's (one multiply-add per element per unit of length): its transposes, twiddle product
# and sums of products are passes over memory, which cost about as much as a dense DFT of
# length 128 on the machines measured.
STEP_COST = 128
# A dense DFT whose matrix (one part) outgrows the smallest L1 data cache of the CPUs we
# run on streams it from L2 for every block of rows: its cost grows with the overflow.
L1_BYTES = 32 << 10
# A radix-r pass of the Stockham FFT costs PASS_COST + r / 4 per element in the same unit,
# and a Stockham FFT BLOCK_COST for its loop and its blocks' transposes: measured on a Zen 3
# (2^18 elements, one core), a pass takes about as long as a dense DFT of length 0.8, the
# rest of the transform 3, whence Stockham passes for every length of small prime factors
# above 4 (a dense DFT of length 8 took 0.73 ms, passes 0.57; of length 64, 3.6 and 0.68).
PASS_COST = 1.5
BLOCK_COST = 3
# A prime length up to this also uses its dense matrix: below it Bluestein's three
# transforms of a length >= 2n cost more than the dense product.
DENSE_PRIME_LENGTH = 256


@converts_complex("stablehlo.fft")
def fft(cx, op):
    kind = reader.enum_name(op.attr("fft_type"))
    lengths = reader.i64_list(op.attr("fft_length"))
    (x,), (out,) = op.operands, op.result_specs
    part = (part_spec(out) if out.dtype.is_complex else out).dtype
    rank = len(out.shape)
    axes = list(range(rank - len(lengths), rank))
    if 0 in out.shape or 0 in op.operand_specs[0].shape:
        zero = builders.filled(builders.splat(0.0, builders.elem_type_of(x.re if isinstance(x, Pair) else x)),
                               out.shape)
        return [Pair(zero, zero) if out.dtype.is_complex else zero]
    if kind == "RFFT":
        y = _real_dft_last(x, part)
        for axis in axes[:-1]:
            y = _dft_along(y, axis, part, inverse=False)
        return [y]
    if kind == "IRFFT":
        for axis in axes[:-1]:
            x = _dft_along(x, axis, part, inverse=True)
        return [_inverse_real_dft_last(x, lengths[-1], part)]
    inverse = kind == "IFFT"
    for axis in axes:
        x = _dft_along(x, axis, part, inverse)
    return [x]


Parts = Pair  # (re, im); im is None for a real tensor entering the first product


def _each(fn, x: Parts) -> Parts:
    return Pair(fn(x.re), None if x.im is None else fn(x.im))


def _shape(x: Parts) -> list[int]:
    return builders.shape_of(x.re)


def _dft_along(x: Pair, axis: int, part: DType, inverse: bool) -> Pair:
    """The DFT along ``axis``: Stockham passes in place where they are the plan (the axis
    needs no transposes), else the last-axis transform on x transposed."""
    shape = _shape(x)
    n = shape[axis]
    if axis < len(shape) - 1 and _plan(n, part).kind == "passes":
        view = _each(lambda v: layout.reshape(v, [math.prod(shape[:axis]), n, math.prod(shape[axis + 1:])]), x)
        y = fft_passes.blocked(view, inverse, 1.0 / n if inverse else 1.0, part)
        return _each(lambda v: layout.reshape(v, shape), y)
    return _along(x, axis, lambda v: _dft_last(v, part, inverse=inverse))


def _along(x: Pair, axis: int, transform) -> Pair:
    """``transform`` (which works on the last axis) applied along ``axis``."""
    rank = len(_shape(x))
    if axis == rank - 1:
        return transform(x)
    perm = [d for d in range(rank) if d != axis] + [axis]
    inverse = [perm.index(d) for d in range(rank)]
    y = transform(_each(lambda v: layout.transpose(v, perm), x))
    return _each(lambda v: layout.transpose(v, inverse), y)


def _swap_last_two(x: Parts) -> Parts:
    rank = len(_shape(x))
    return _each(lambda v: layout.transpose(v, [*range(rank - 2), rank - 1, rank - 2]), x)


def _constant(array: np.ndarray, part: DType) -> ir.Value:
    return builders.dense_constant(array, TensorSpec(array.shape, part))


def _matmul(a: ir.Value, b: ir.Value) -> ir.Value:
    """``a`` [..., k] times the matrix ``b`` [k, m], as one 2-d linalg.matmul."""
    shape = builders.shape_of(a)
    k, m = builders.shape_of(b)
    rows = layout.reshape(a, [math.prod(shape[:-1]), k])
    init = builders.filled(builders.splat(0.0, builders.elem_type_of(a)), [math.prod(shape[:-1]), m])
    return layout.reshape(linalg.matmul(rows, b, outs=[init]), [*shape[:-1], m])


def _times_matrix(x: Parts, matrix: np.ndarray, part: DType) -> Pair:
    """x [..., k] times a complex constant matrix [k, m]: four real products (two for a
    real x)."""
    re, im = _constant(matrix.real, part), _constant(matrix.imag, part)
    if x.im is None:
        return Pair(_matmul(x.re, re), _matmul(x.re, im))
    return Pair(arith.subf(_matmul(x.re, re), _matmul(x.im, im)),
                arith.addf(_matmul(x.re, im), _matmul(x.im, re)))


def _times_trailing(x: Parts, factor: np.ndarray, part: DType) -> Pair:
    """x times a complex constant shaped like x's trailing dims (broadcast over the
    leading ones), in one elementwise generic."""
    rank, k = len(_shape(x)), factor.ndim
    dims = [ir.AffineDimExpr.get(d) for d in range(rank)]
    identity, trailing = ir.AffineMap.get(rank, 0, dims), ir.AffineMap.get(rank, 0, dims[rank - k:])
    ins = [x.re] + ([] if x.im is None else [x.im]) + [_constant(factor.real, part), _constant(factor.imag, part)]

    def body(*args):
        if x.im is None:
            a, c, d = args[:3]
            return [arith.mulf(a, c), arith.mulf(a, d)]
        a, b, c, d = args[:4]
        return [arith.subf(arith.mulf(a, c), arith.mulf(b, d)), arith.addf(arith.mulf(a, d), arith.mulf(b, c))]
    outs = [builders.empty_like(x.re), builders.empty_like(x.re)]
    re, im = builders.generic(ins, outs, [identity] * (len(ins) - 2) + [trailing] * 2 + [identity] * 2,
                              ["parallel"] * rank, body)
    return Pair(re, im)


def _dft_last(x: Parts, part: DType, inverse: bool) -> Pair:
    """The DFT along the last axis (IFFT: conjugate roots and the 1/n scale, as XLA's)."""
    n = _shape(x)[-1]
    return _scaled_dft_last(x, part, inverse, 1.0 / n if inverse else 1.0)


def _scaled_dft_last(x: Parts, part: DType, inverse: bool, scale: float) -> Pair:
    """The DFT along the last axis times ``scale``, folded into its last constant factor
    (a DFT matrix or a chirp) rather than a pass of its own."""
    shape = _shape(x)
    n = shape[-1]
    if n == 1:  # scale is 1 (an inverse of length 1) wherever a length 1 is transformed
        return x if x.im is not None else Pair(x.re, builders.filled(builders.splat(0.0, builders.elem_type_of(x.re)), shape))
    plan = _plan(n, part)
    if plan.kind == "passes":
        view = _each(lambda v: layout.reshape(v, [math.prod(shape[:-1]), n, 1]), x)
        return _each(lambda v: layout.reshape(v, shape), fft_passes.blocked(view, inverse, scale, part))
    if plan.kind == "dense":
        index = np.arange(n)
        return _times_matrix(x, fft_passes.roots(index, index, n, inverse) * scale, part)
    if plan.kind == "bluestein":
        return _bluestein_last(x, part, inverse, scale)
    n1 = plan.n1
    n2 = n // n1
    # x[j1, j2] = x[n2 j1 + j2];  X[k1 + n1 k2] = sum_j2 w_n2^(j2 k2) w_n^(j2 k1) sum_j1 w_n1^(j1 k1) x[j1, j2]
    rows = _swap_last_two(_each(lambda v: layout.reshape(v, [*shape[:-1], n1, n2]), x))  # [..., j2, j1]
    y = _scaled_dft_last(rows, part, inverse, 1.0)  # [..., j2, k1]
    y = _times_trailing(y, fft_passes.roots(np.arange(n2), np.arange(n1), n, inverse), part)
    z = _scaled_dft_last(_swap_last_two(y), part, inverse, scale)  # [..., k1, k2]
    return _each(lambda v: layout.reshape(v, shape), _swap_last_two(z))  # k = k2 n1 + k1


class Plan(NamedTuple):
    """A length's cheapest transform: its cost in the unit of STEP_COST's comment, its kind
    (dense, bluestein, passes: fft_passes' Stockham FFT, split: a Cooley-Tukey step) and a
    split's n1."""
    cost: float
    kind: str
    n1: int | None = None


def _plan(n: int, part: DType) -> Plan:
    return _plan_for_size(n, part.itemsize)


@functools.cache
def _plan_for_size(n: int, itemsize: int) -> Plan:
    """Length n's cheapest transform: dense, Stockham passes, or a Cooley-Tukey step
    n = n1 * n2 with n1 <= n2 whose sides are planned the same way; a length with none
    cheaper than dense above DENSE_PRIME_LENGTH is Bluestein's."""
    best = Plan(n * max(1.0, n * n * itemsize / L1_BYTES), "dense")
    steps = fft_passes.radices(n)
    if steps is not None:
        cost = BLOCK_COST + sum(PASS_COST + r / 4 for r in steps)
        if cost < best.cost:
            best = Plan(cost, "passes")
    for n1 in range(2, math.isqrt(n) + 1):
        if n % n1 == 0:
            cost = _plan_for_size(n1, itemsize).cost + _plan_for_size(n // n1, itemsize).cost + STEP_COST
            if cost < best.cost:  # a tie keeps the fewer passes
                best = Plan(cost, "split", n1)
    if best.kind == "dense" and n > DENSE_PRIME_LENGTH:  # Bluestein: three transforms of length m
        m = 1 << (2 * n - 2).bit_length()
        best = Plan(3 * (_plan_for_size(m, itemsize).cost + STEP_COST), "bluestein")
    return best


def _bluestein_last(x: Parts, part: DType, inverse: bool, scale: float) -> Pair:
    """A prime length n: with w_j = exp(-+ i pi j^2 / n), X_k = w_k sum_j (x_j w_j)
    conj(w)_(k-j), a circular convolution of a power-of-two length m >= 2n - 1."""
    shape = _shape(x)
    n = shape[-1]
    m = 1 << (2 * n - 2).bit_length()
    j = np.arange(n, dtype=np.int64)
    chirp = np.exp((1.0 if inverse else -1.0) * 1j * np.pi * np.mod(j * j, 2 * n) / n)
    kernel = np.zeros(m, np.complex128)
    kernel[:n] = np.conj(chirp)
    kernel[m - n + 1:] = np.conj(chirp[1:][::-1])
    padding = [0] * (len(shape) - 1)
    a = _each(lambda v: slices.pad(v, 0.0, [*padding, 0], [*padding, m - n], [0] * len(shape)),
              _times_trailing(x, chirp, part))
    spectrum = _times_trailing(_scaled_dft_last(a, part, False, 1.0), np.fft.fft(kernel), part)
    convolved = _dft_last(spectrum, part, inverse=True)
    head = _each(lambda v: slices.extract_slice(v, shape, [0] * len(shape)), convolved)
    return _times_trailing(head, chirp * scale, part)


def _real_dft_last(x: ir.Value, part: DType) -> Pair:
    """RFFT along the last axis: the first n // 2 + 1 terms of the DFT of a real x."""
    shape = builders.shape_of(x)
    n = shape[-1]
    half = n // 2 + 1
    if _plan(n, part).kind == "dense":
        return _times_matrix(Pair(x, None), fft_passes.roots(np.arange(n), np.arange(half), n, False), part)
    if n % 2 == 0:
        return _real_dft_by_half(x, part)
    y = _dft_last(Pair(x, None), part, inverse=False)
    return _each(lambda v: slices.extract_slice(v, [*shape[:-1], half], [0] * len(shape)), y)


def _real_dft_by_half(x: ir.Value, part: DType) -> Pair:
    """RFFT of an even length n = 2m through one complex DFT of length m, of z_j = x_2j +
    i x_2j+1: half the work of a complex DFT of length n. With Z_m = Z_0 and
    Z'_k = conj(Z_(m-k)), the even samples' spectrum is (Z_k + Z'_k) / 2, the odd ones'
    (Z_k - Z'_k) / 2i, and X_k = even_k + w_n^k odd_k."""
    shape = builders.shape_of(x)
    lead, m = shape[:-1], shape[-1] // 2
    pairs = layout.reshape(x, [*lead, m, 2])
    z = Pair(*(slices.extract_slice(pairs, [*lead, m, 1], [0] * len(shape) + [k], shape=[*lead, m])
               for k in (0, 1)))
    spectrum = _scaled_dft_last(z, part, False, 1.0)
    # Z_0 .. Z_m (Z_m = Z_0); X_k for k < m reads Z_(m-k), ext's reverse from its second term
    rank = len(shape)
    ext = _each(lambda v: slices.insert_slice(slices.extract_slice(v, [*lead, 1], [0] * rank),
                                              slices.insert_slice(v, builders.empty(TensorSpec([*lead, m + 1], part)),
                                                                  [0] * rank),
                                              [0] * (rank - 1) + [m]), spectrum)
    mirror = _each(lambda v: layout.reverse(slices.extract_slice(v, [*lead, m], [0] * (rank - 1) + [1]), [rank - 1]),
                   ext)
    angle = -np.pi * np.arange(m + 1) / m
    w = np.cos(angle) + 1j * np.sin(angle)

    def body(ar, ai, br, bi, c, s, _re, _im):
        half_ = builders.constant_like(0.5, ar)
        er, ei = arith.mulf(arith.addf(ar, br), half_), arith.mulf(arith.subf(ai, bi), half_)
        # odd = (Z_k - conj Z_(m-k)) / 2i
        orr, oi = arith.mulf(arith.addf(ai, bi), half_), arith.mulf(arith.subf(br, ar), half_)
        return [arith.addf(er, arith.subf(arith.mulf(c, orr), arith.mulf(s, oi))),
                arith.addf(ei, arith.addf(arith.mulf(c, oi), arith.mulf(s, orr)))]
    # The m terms below the last apart from it: m is whole vectors, read backwards in order
    # (cpu/lane_reversals.py), where m + 1 would leave the loop scalar. The last one, from
    # Z_0 alone, is a column computed on its own (an op over the leading dims).
    low = _with_last_axis_constants([*spectrum, *mirror], [w.real[:m], w.imag[:m]], part, body)
    first = _each(lambda v: slices.extract_slice(v, [*lead, 1], [0] * rank, shape=lead), spectrum)
    last = body(*first, *first, *(builders.constant_like(float(c), first.re) for c in (w.real[m], w.imag[m])),
                None, None)
    return Pair(*(slices.insert_slice(t, slices.insert_slice(l, builders.empty(TensorSpec([*lead, m + 1], part)),
                                                             [0] * rank), [0] * (rank - 1) + [m], sizes=[*lead, 1])
                  for l, t in zip(low, last)))


def _with_last_axis_constants(ins: list[ir.Value], constants: list[np.ndarray], part: DType, body) -> Pair:
    """One elementwise generic over ``ins`` (all alike) and ``constants`` along their last
    axis (broadcast along the leading ones); two outputs, the result's parts."""
    rank = len(builders.shape_of(ins[0]))
    dims = [ir.AffineDimExpr.get(d) for d in range(rank)]
    identity, last = ir.AffineMap.get(rank, 0, dims), ir.AffineMap.get(rank, 0, dims[-1:])
    outs = [builders.empty_like(ins[0]), builders.empty_like(ins[0])]
    re, im = builders.generic(ins + [_constant(c, part) for c in constants], outs,
                              [identity] * len(ins) + [last] * len(constants) + [identity] * 2,
                              ["parallel"] * rank, body)
    return Pair(re, im)


def _inverse_real_dft_last(x: Pair, n: int, part: DType) -> ir.Value:
    """IRFFT along the last axis: the real signal of length n whose spectrum has the
    n // 2 + 1 leading terms ``x`` and Hermitian symmetry. The imaginary parts of the zero
    and Nyquist terms drop out, as in numpy and XLA."""
    shape = _shape(x)
    half = n // 2 + 1
    if shape[-1] != half:  # fewer terms: zeros; more: the extra ones are not read
        x = _each(lambda v: slices.pad(v, 0.0, [0] * len(shape), [0] * (len(shape) - 1) + [half - shape[-1]],
                                       [0] * len(shape)), x)
        shape = _shape(x)
    if _plan(n, part).kind == "dense":
        # out_j = (1/n) sum_k c_k (Re X_k cos t - Im X_k sin t), t = 2 pi j k / n, c_k = 2
        # for the terms that stand for a conjugate pair too
        k = np.arange(half)
        weight = np.where((k == 0) | (2 * k == n), 1.0, 2.0)[:, None] / n
        roots = fft_passes.roots(k, np.arange(n), n, inverse=True) * weight
        return arith.subf(_matmul(x.re, _constant(roots.real, part)), _matmul(x.im, _constant(roots.imag, part)))
    if n % 2 == 0:
        return _inverse_real_dft_by_half(x, part)
    # the whole spectrum: X_k for k < half, conj(X_(n-k)) above
    mirrored = _each(lambda v: layout.reverse(slices.extract_slice(v, [*shape[:-1], n - half], [0] * (len(shape) - 1) + [1]),
                                              [len(shape) - 1]), x)
    mirrored = Pair(mirrored.re, arith.negf(mirrored.im))
    full_shape = [*shape[:-1], n]
    full = _each(lambda v: builders.empty(TensorSpec(full_shape, part)), x)
    full = Pair(*(slices.insert_slice(m, slices.insert_slice(h, f, [0] * len(shape)), [0] * (len(shape) - 1) + [half])
                  for h, m, f in zip(x, mirrored, full)))
    return _dft_last(full, part, inverse=True).re


def _inverse_real_dft_by_half(x: Pair, part: DType) -> ir.Value:
    """IRFFT of an even length n = 2m from the m + 1 terms ``x`` through one inverse complex
    DFT of length m: the even samples' spectrum is (X_k + conj X_(m-k)) / 2, the odd ones'
    (X_k - conj X_(m-k)) conj(w_n)^k / 2, and the inverse DFT of even + i odd holds the even
    samples in its real parts and the odd ones in its imaginary parts."""
    shape = _shape(x)
    lead, m = shape[:-1], shape[-1] - 1
    rank = len(shape)
    head = _each(lambda v: slices.extract_slice(v, [*lead, m], [0] * rank), x)
    tail = _each(lambda v: layout.reverse(slices.extract_slice(v, [*lead, m], [0] * (rank - 1) + [1]), [rank - 1]), x)
    angle = np.pi * np.arange(m) / m
    w = np.cos(angle) + 1j * np.sin(angle)
    keep = np.ones(m)
    keep[0] = 0.0  # the imaginary parts of the zero and Nyquist terms drop out (k = 0 reads both)

    def body(ar, ai, br, bi, k, c, s, _re, _im):
        half_ = builders.constant_like(0.5, ar)
        ai, bi = arith.mulf(ai, k), arith.mulf(bi, k)
        er, ei = arith.mulf(arith.addf(ar, br), half_), arith.mulf(arith.subf(ai, bi), half_)
        dr, di = arith.mulf(arith.subf(ar, br), half_), arith.mulf(arith.addf(ai, bi), half_)
        orr, oi = arith.subf(arith.mulf(dr, c), arith.mulf(di, s)), arith.addf(arith.mulf(dr, s), arith.mulf(di, c))
        return [arith.subf(er, oi), arith.addf(ei, orr)]  # even + i odd
    z = _with_last_axis_constants([head.re, head.im, tail.re, tail.im], [keep, w.real, w.imag], part, body)
    z = _dft_last(z, part, inverse=True)
    pairs = builders.empty(TensorSpec([*lead, m, 2], part))
    for k, v in enumerate(z):
        pairs = slices.insert_slice(v, pairs, [0] * rank + [k], sizes=[*lead, m, 1])
    return layout.reshape(pairs, [*lead, 2 * m])
