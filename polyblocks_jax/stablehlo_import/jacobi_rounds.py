"""A two-sided Jacobi sweep (eigh's, symmetric_eigen.py) as rounds of disjoint rotations.

The odd-even ordering (Luk and Park) rotates every pair once in n rounds: round t rotates
the pairs (k, k + 1) of every k of t's parity, all at once, and swaps each pair's two
indices, so that indices apart meet in later rounds; after the n rounds each index i stands
at n - 1 - i. The matrices are kept with the even indices first, then the odd ones ("halves"
order, rows and columns): a round's first and second members then lie in two blocks of
consecutive rows (columns), and a round is three passes over those blocks (a's rows, its
columns, w's rows), vectorized along them, where rotating one pair at a time touched two
rows and two strided columns per rotation.
"""
from __future__ import annotations

from mlir import ir

from polyblocks_jax.stablehlo_import import field
from polyblocks_jax.tensor_ir import builders
from polyblocks_jax.stablehlo_import.complex_values import Value, flatten
from polyblocks_jax.stablehlo_import.jacobi_rotations import rotation
from polyblocks_jax.stablehlo_import.linear_algebra import affine_map, dims


def to_halves(x: Value, axes: list[int]) -> Value:
    """``x`` with the even indices of each of ``axes`` first, then the odd ones."""
    for axis in axes:
        n = field.shape_of(x)[axis]
        if n < 2:
            continue
        parts = [_strided(x, axis, start, (n - start + 1) // 2, 2) for start in (0, 1)]
        out = field.empty_like(x)
        for start, part in enumerate(parts):
            out = _insert(part, out, axis, start * ((n + 1) // 2), 1)
        x = out
    return x


def from_halves(x: Value, axes: list[int]) -> Value:
    """The inverse of ``to_halves``."""
    for axis in axes:
        n = field.shape_of(x)[axis]
        if n < 2:
            continue
        evens = (n + 1) // 2
        out = field.empty_like(x)
        for start, (offset, size) in enumerate(((0, evens), (evens, n // 2))):
            out = _insert(_strided(x, axis, offset, size, 1), out, axis, start, 2)
        x = out
    return x


def sweep(a: Value, w: Value) -> list[Value]:
    """n rounds on ``a`` (Hermitian, n x n) and ``w`` (the rotations' product so far, rows
    rotated as a's), both in halves order; each index back in its place after them."""
    n = field.shape_of(a)[0]

    def round_of(carried: list[Value], parity: int) -> list[Value]:
        evens, pairs = (n + 1) // 2, (n - parity) // 2
        # first members: evens from 0 (odds from evens); second: odds from evens (evens from 1)
        p, q = (0, evens) if parity == 0 else (evens, 1)
        return _round(carried, p, q, pairs) if pairs else carried
    carried = [a, w]
    if n > 1:
        flat = builders.for_loop(builders.index_constant(0), builders.index_constant(n // 2),
                                 builders.index_constant(1), flatten(carried),
                                 lambda _, vs: flatten(round_of(round_of(field.regroup(vs, carried), 0), 1)))
        carried = field.regroup(flat, carried)
    a, w = round_of(carried, 0) if n % 2 else carried
    return [_reversed(a, [0, 1]), _reversed(w, [0])]


def _round(carried: list[Value], p: int, q: int, pairs: int) -> list[Value]:
    """R a R^H and R w for the pairs (p + k, q + k), k < pairs, R = P J^H: each pair's
    rotation, its two indices swapped."""
    a, w = carried
    n = field.shape_of(a)[0]
    flat = field.reshape(a, [n * n])
    app, aqq, apq = (field.extract_slice(flat, [pairs], [k], strides=[n + 1]) for k in (p * (n + 1), q * (n + 1),
                                                                                       p * n + q))
    identity = ir.AffineMap.get_identity(1)
    c, s = field.generic([field.real(app), field.real(aqq), apq],
                         [builders.empty_like(field.real(app)), field.empty_like(apq)], [identity] * 5,
                         ["parallel"], lambda x, y, z, *_: list(rotation(x, y, z)))
    a = _rotated(_rotated(a, p, q, c, s, 0), p, q, c, s, 1)
    return [a, _rotated(w, p, q, c, s, 0)]


def _rotated(x: Value, p: int, q: int, c: ir.Value, s: Value, axis: int) -> Value:
    """Along ``axis`` 0 (rows): blocks from p and q replaced by conj(s_k) x_p + c_k x_q and
    c_k x_p - s_k x_q (J^H x, each pair's two swapped); along 1 (columns) by s_k x_p + c_k
    x_q and c_k x_p - conj(s_k) x_q (x J, swapped). The blocks are the generic's outputs,
    read where they are written, so that they need no buffers of their own."""
    pairs = builders.shape_of(c)[0]
    xp, xq = (_strided(x, axis, start, pairs, 1) for start in (p, q))
    d = dims(2)
    identity, per_pair = ir.AffineMap.get_identity(2), affine_map(d, [d[axis]])

    def body(ck: ir.Value, sk: Value, yp: Value, yq: Value) -> list[Value]:
        s_p, s_q = (field.conj(sk), sk) if axis == 0 else (sk, field.conj(sk))
        return [field.add(field.mul(s_p, yp), field.mul(ck, yq)), field.sub(field.mul(ck, yp), field.mul(s_q, yq))]
    new_p, new_q = field.generic([c, s], [xp, xq], [per_pair, per_pair, identity, identity], ["parallel"] * 2, body)
    return _insert(new_q, _insert(new_p, x, axis, p, 1), axis, q, 1)


def _reversed(x: Value, axes: list[int]) -> Value:
    """Index i of each of ``axes`` moved to n - 1 - i, in halves order: the whole axis
    reversed where n is even (the evens' places go to the odds'), each half where odd."""
    for axis in axes:
        n = field.shape_of(x)[axis]
        if n < 2:
            continue
        if n % 2 == 0:
            x = field.reverse(x, [axis])
            continue
        evens = (n + 1) // 2
        for offset, size in ((0, evens), (evens, n // 2)):
            x = _insert(field.reverse(_strided(x, axis, offset, size, 1), [axis]), x, axis, offset, 1)
    return x


def _strided(x: Value, axis: int, start: int, size: int, stride: int) -> Value:
    """``size`` indices of ``axis`` from ``start`` by ``stride``, all of the other axis."""
    sizes, offsets, strides = list(field.shape_of(x)), [0, 0], [1, 1]
    sizes[axis], offsets[axis], strides[axis] = size, start, stride
    return field.extract_slice(x, sizes, offsets, strides=strides)


def _insert(part: Value, x: Value, axis: int, start: int, stride: int) -> Value:
    offsets, strides = [0, 0], [1, 1]
    offsets[axis], strides[axis] = start, stride
    return field.insert_slice(part, x, offsets, strides=strides)
