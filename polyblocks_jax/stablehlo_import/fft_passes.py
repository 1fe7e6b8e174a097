"""Radix passes of a Stockham FFT, each one elementwise linalg.generic on the (re, im) parts.

A DFT of length n = r_1 ... r_p along the middle axis of x (L, n, R) is p passes. Pass s
reads its input viewed as (L, M, r, R') (M = r_1 ... r_(s-1), R' the rest of the length
times R) and writes (L, r, M, R'): for every (l, k2, j), the r inputs [l, k2, q, j] times
twiddles w_(rM)^(q k2), then an r-point DFT unrolled in the generic's body, whose output k1
goes to [l, k1, k2, j] (decimation in time). The output comes out in natural order (no digit
reversal), and every operand is contiguous along R', the dim the vectorizer runs along. The
r outputs are slices of one tensor inserted in turn, which the in-place stage computes into
the result's buffer.

``blocked`` runs the passes on blocks of one vector's width of the batch at a time, in a
loop: a block's passes stay in L2 (passes over a whole batch of 256 x 1024 streamed it from
memory each time: 1.5 times slower). A last-axis transform takes its blocks as rows, transposed, so that
the batch becomes the contiguous dim.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from mlir import ir
from mlir.dialects import arith

from polyblocks_jax.dtypes import DType, TensorSpec
from polyblocks_jax.stablehlo_import.complex_values import Pair
from polyblocks_jax.tensor_ir import builders, layout, slices

# The largest prime radix of a pass: an r-point DFT in a generic's body holds its 2r inputs
# and outputs in vector registers (16 on AVX2) and costs ~r^2 / 2 products for a prime r.
MAX_RADIX = 7
# The batch of a block: one AVX2 vector of f32, enough lanes for every pass to vectorize.
BLOCK = 8
# The radices of a length's factor 2^k, best first: a radix-4 pass has no multiplications in
# its DFT and halves the passes of radix 2 (radix 8 measured no faster: its 16 inputs spill).
_PREFERRED = (4, 2)

Scalar = tuple[ir.Value, ir.Value]  # (re, im) of one element in a generic's body


def radices(n: int) -> list[int] | None:
    """The radices of the passes for length n (the first pass's first), or None where n has
    a prime factor above MAX_RADIX."""
    odd, rest = [], n
    for p in range(3, MAX_RADIX + 1, 2):
        while rest % p == 0:
            odd.append(p)
            rest //= p
    even = []
    for r in _PREFERRED:
        while rest % r == 0:
            even.append(r)
            rest //= r
    # Odd radices first: the first pass has no twiddles, and theirs cost the most.
    return odd + even if rest == 1 else None


def blocked(x: Pair, inverse: bool, scale: float, part: DType) -> Pair:
    """The DFT (times ``scale``) along the middle axis of x (L, n, R), by ``stockham`` on
    blocks of the batch in a loop: BLOCK rows of L transposed where R is 1, else BLOCK
    columns of R per row of L."""
    lead, n, trail = builders.shape_of(x.re)
    steps = radices(n)
    if x.im is None:
        x = Pair(x.re, builders.filled(builders.splat(0.0, builders.elem_type_of(x.re)), [lead, n, trail]))
    rows = trail == 1
    width = math.gcd(lead if rows else trail, BLOCK)
    counts = [lead // width] if rows else [lead, trail // width]
    if rows:  # (L, n): slices without unit dims, whose folds through reshapes are ambiguous
        x = Pair(*(layout.reshape(v, [lead, n]) for v in x))

    def step(ivs: list[ir.Value], outs: list[ir.Value]) -> list[ir.Value]:
        start = arith.muli(ivs[-1], builders.index_constant(width))
        if rows:
            offsets, sizes = [start, 0], [width, n]
            block = Pair(*(layout.reshape(layout.transpose(slices.extract_slice(v, sizes, offsets), [1, 0]),
                                          [1, n, width]) for v in x))
        else:
            offsets, sizes = [ivs[0], 0, start], [1, n, width]
            block = Pair(*(slices.extract_slice(v, sizes, offsets) for v in x))
        y = stockham(block, steps, inverse, scale, part)
        if rows:
            y = Pair(*(layout.transpose(layout.reshape(v, [n, width]), [1, 0]) for v in y))
        return [slices.insert_slice(v, o, offsets) for v, o in zip(y, outs)]
    init = [builders.empty(TensorSpec([lead, n] if rows else [lead, n, trail], part)) for _ in range(2)]
    return Pair(*(layout.reshape(v, [lead, n, trail]) for v in builders.loop_nest(counts, init, step)))


def stockham(x: Pair, steps: Sequence[int], inverse: bool, scale: float, part: DType) -> Pair:
    """The DFT (times ``scale``) along the middle axis of x (L, n, R), one pass per radix
    of ``steps`` (whose product is n)."""
    lead, n, trail = builders.shape_of(x.re)
    m = 1
    for s, r in enumerate(steps):
        rest = n // (m * r)
        view = Pair(*(layout.reshape(v, [lead, m, r, rest * trail]) for v in x))
        x = _radix_pass(view, inverse, scale if s == len(steps) - 1 else 1.0, part)
        m *= r
    return Pair(*(layout.reshape(v, [lead, n, trail]) for v in x))


def _radix_pass(x: Pair, inverse: bool, scale: float, part: DType) -> Pair:
    """x (L, M, r, R) to (L, r, M, R): the r-point DFTs of the twiddled inputs."""
    lead, m, r, rest = builders.shape_of(x.re)
    shape = [lead, m, rest]
    ins = [slices.extract_slice(v, [lead, m, 1, rest], [0, 0, q, 0], shape=shape) for q in range(r) for v in x]
    dims = [ir.AffineDimExpr.get(d) for d in range(3)]
    identity, middle = ir.AffineMap.get(3, 0, dims), ir.AffineMap.get(3, 0, [dims[1]])
    twiddled = m > 1
    if twiddled:
        w = roots(np.arange(1, r), np.arange(m), r * m, inverse)  # [q - 1, k2]
        ins += [builders.dense_constant(np.ascontiguousarray(c), TensorSpec([m], part))
                for row in w for c in (row.real, row.imag)]

    def body(*args):
        a = [(args[2 * q], args[2 * q + 1]) for q in range(r)]
        if twiddled:
            tw = args[2 * r:4 * r - 2]
            a = [a[0]] + [_mul(a[q], (tw[2 * q - 2], tw[2 * q - 1])) for q in range(1, r)]
        out = small_dft(a, inverse)
        if scale != 1.0:
            out = [_scale(v, scale) for v in out]
        return [p for v in out for p in v]
    outs = [builders.empty(TensorSpec(shape, part)) for _ in range(2 * r)]
    results = builders.generic(ins, outs, [identity] * (2 * r) + [middle] * (len(ins) - 2 * r) + [identity] * (2 * r),
                               ["parallel"] * 3, body)
    parts = []
    for p in range(2):
        dest = builders.empty(TensorSpec([lead, r, m, rest], part))
        for k in range(r):
            dest = slices.insert_slice(results[2 * k + p], dest, [0, k, 0, 0], sizes=[lead, 1, m, rest])
        parts.append(dest)
    return Pair(*parts)


def roots(rows: np.ndarray, cols: np.ndarray, n: int, inverse: bool) -> np.ndarray:
    """exp(+-2 pi i r c / n) for every pair of ``rows`` x ``cols``, in float64 with the
    exponent reduced modulo n first (exact for any n)."""
    exponent = np.mod(np.multiply.outer(rows.astype(np.int64), cols.astype(np.int64)), n)
    angle = (2.0 if inverse else -2.0) * np.pi * exponent / n
    return np.cos(angle) + 1j * np.sin(angle)


def _mul(a: Scalar, b: Scalar) -> Scalar:
    return (arith.subf(arith.mulf(a[0], b[0]), arith.mulf(a[1], b[1])),
            arith.addf(arith.mulf(a[0], b[1]), arith.mulf(a[1], b[0])))


def _add(a: Scalar, b: Scalar) -> Scalar:
    return arith.addf(a[0], b[0]), arith.addf(a[1], b[1])


def _sub(a: Scalar, b: Scalar) -> Scalar:
    return arith.subf(a[0], b[0]), arith.subf(a[1], b[1])


def _scale(a: Scalar, c: float) -> Scalar:
    k = builders.constant_like(c, a[0])
    return arith.mulf(a[0], k), arith.mulf(a[1], k)


def _times_root(a: Scalar, e: int, n: int, inverse: bool) -> Scalar:
    """a times exp(-+2 pi i e / n), with the exact roots (1, -1, +-i) as moves and the
    eighth roots as one sum and one product per part."""
    e %= n
    if 8 * e % n == 0:
        eighth = 8 * e // n if not inverse else (-8 * e // n) % 8
        re, im = a
        neg = arith.negf
        if eighth % 2 == 0:  # multiply by (-i)^(eighth / 2)
            return [(re, im), (im, neg(re)), (neg(re), neg(im)), (neg(im), re)][eighth // 2]
        h = math.sqrt(0.5)
        # exp(-i pi eighth / 4) = (+-1 +-i) sqrt(1/2)
        c = {1: (1, -1), 3: (-1, -1), 5: (-1, 1), 7: (1, 1)}[eighth]
        if c == (1, -1):
            v = (arith.addf(re, im), arith.subf(im, re))
        elif c == (-1, -1):
            v = (arith.subf(im, re), neg(arith.addf(re, im)))
        elif c == (-1, 1):
            v = (neg(arith.addf(re, im)), arith.subf(re, im))
        else:
            v = (arith.subf(re, im), arith.addf(re, im))
        return _scale(v, h)
    w = roots(np.array([1]), np.array([e]), n, inverse)[0, 0]
    return _mul(a, (builders.constant_like(float(w.real), a[0]), builders.constant_like(float(w.imag), a[0])))


def small_dft(a: list[Scalar], inverse: bool) -> list[Scalar]:
    """The DFT of the len(a) scalars: Cooley-Tukey steps on its smallest prime factor, and a
    prime length as sums over the symmetric pairs of inputs (half the products)."""
    n = len(a)
    if n == 1:
        return a
    p = next(f for f in range(2, n + 1) if n % f == 0)
    if p == n:
        return _prime_dft(a, inverse)
    m = n // p
    subs = [small_dft(a[q::p], inverse) for q in range(p)]  # DFT_m of x[q + p t]
    out: list[Scalar | None] = [None] * n
    for k2 in range(m):
        col = [subs[0][k2]] + [_times_root(subs[q][k2], q * k2, n, inverse) for q in range(1, p)]
        for k1, v in enumerate(small_dft(col, inverse)):
            out[k2 + m * k1] = v
    return out


def _prime_dft(a: list[Scalar], inverse: bool) -> list[Scalar]:
    n = len(a)
    if n == 2:
        return [_add(a[0], a[1]), _sub(a[0], a[1])]
    sums = [_add(a[q], a[n - q]) for q in range(1, (n + 1) // 2)]
    diffs = [_sub(a[q], a[n - q]) for q in range(1, (n + 1) // 2)]
    out = [a[0]]
    for s in sums:
        out[0] = _add(out[0], s)
    sign = 1.0 if inverse else -1.0
    for k in range(1, n):
        re, im = a[0]
        for q, (s, d) in enumerate(zip(sums, diffs), start=1):
            c = builders.constant_like(math.cos(2 * math.pi * q * k / n), re)
            sn = builders.constant_like(sign * math.sin(2 * math.pi * q * k / n), re)
            # (s_re + i s_im) c + i sn (d_re + i d_im)
            re = arith.addf(re, arith.subf(arith.mulf(s[0], c), arith.mulf(d[1], sn)))
            im = arith.addf(im, arith.addf(arith.mulf(s[1], c), arith.mulf(d[0], sn)))
        out.append((re, im))
    return out
