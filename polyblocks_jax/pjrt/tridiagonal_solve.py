"""``lax.linalg.tridiagonal_solve`` for platform "polyblocks": Gaussian elimination with
partial pivoting, in JAX.

JAX's rule for platforms without a library (Thomas' algorithm) neither pivots (a zero on
the diagonal, as in [[0, 1], [1, 0]], gives inf and NaN) nor takes ``perturb_singular``
(eigh_tridiagonal's eigenvectors, by inverse iteration, ask for it). The CPU calls LAPACK's
gtsv (rows exchanged where the subdiagonal element is larger; a zero pivot makes the whole
system NaN) or jaxlib's perturbed kernel (rows exchanged by pivots scaled by their rows;
pivots below one that would overflow the solution nudged by multiples of eps times the
largest element of U, as LAPACK's xLAGTS does). This module is both, as scans over the
rows: elimination forward, then back substitution.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def tridiagonal_solve(dl: jax.Array, d: jax.Array, du: jax.Array, b: jax.Array, *,
                      perturb_singular: bool) -> jax.Array:
    """x with A x = b for each tridiagonal A (..., n) given by its three diagonals
    (``dl[..., 0]`` and ``du[..., n - 1]`` unused) and b (..., n, k)."""
    solve = functools.partial(_solve, perturb_singular=perturb_singular)
    for _ in range(dl.ndim - 1):
        solve = jax.vmap(solve)
    return solve(dl, d, du, b)


def _solve(dl: jax.Array, d: jax.Array, du: jax.Array, b: jax.Array, perturb_singular: bool) -> jax.Array:
    n = d.shape[0]
    if n == 0:
        return b
    real = jnp.finfo(d.dtype).dtype
    zero = jnp.zeros((), d.dtype)
    du = du.at[n - 1].set(zero)  # the last row has no superdiagonal element

    def eliminate(carry, row):
        """Row k (pivot a0, a1 beside it, its right side xk) against row k + 1: row k final."""
        a0, a1, xk, scale1 = carry
        s, dd, su, r = row
        scale2 = jnp.abs(s) + jnp.abs(dd) + jnp.abs(su)
        if perturb_singular:  # pivots relative to their rows
            piv1 = jnp.where(a0 == zero, jnp.zeros((), real), jnp.abs(a0) / scale1)
            swap = jnp.abs(s) / scale2 > piv1
        else:  # LAPACK's gtsv
            swap = jnp.abs(s) > jnp.abs(a0)
        swap &= s != zero
        keep_factor = jnp.where(s == zero, zero, s / jnp.where(swap | (s == zero), 1, a0))
        swap_factor = a0 / jnp.where(swap, s, 1)
        kept = (a0, a1, zero, xk), (dd - keep_factor * a1, su, r - keep_factor * xk)
        swapped = (s, dd, su, r), (a1 - swap_factor * dd, -swap_factor * su, xk - swap_factor * r)
        (out, (n0, n1, nx)) = jax.tree.map(lambda p, q: jnp.where(swap, q, p), kept, swapped)
        scale = jnp.where(swap, jnp.abs(n0) + jnp.abs(n1), scale2)
        return (n0, n1, nx, scale), out

    first = (d[0], du[0], b[0], jnp.abs(d[0]) + jnp.abs(du[0]))
    (u0_last, _, x_last, _), (u0, u1, u2, x) = lax.scan(eliminate, first, (dl[1:], d[1:], du[1:], b[1:]))
    u0, x = jnp.concatenate([u0, u0_last[None]]), jnp.concatenate([x, x_last[None]])
    u1 = jnp.concatenate([u1, zero[None]])
    u2 = jnp.concatenate([u2, zero[None]])

    if perturb_singular:
        # eps times the largest element of U: the rows before the last two, the first row as
        # given, and the last pivot (as jaxlib's kernel counts them)
        inner = jnp.max(jnp.abs(jnp.stack([u0[:n - 2], u1[:n - 2], u2[:n - 2]])), initial=0)
        largest = jnp.maximum(jnp.maximum(inner, jnp.maximum(jnp.abs(d[0]), jnp.abs(du[0]))), jnp.abs(u0[n - 1]))
        perturb = jnp.finfo(real).eps * largest

    def substitute(carry, row):
        """x[k] from the two rows below it."""
        x1, x2 = carry
        p, v1, v2, xk = row
        rhs = xk - v1 * x1 - v2 * x2
        if perturb_singular:
            p, rhs = _perturbed_pivot(perturb, p, rhs)
        xk = rhs * (1 / p)
        return (xk, x1), xk

    _, solved = lax.scan(substitute, (jnp.zeros_like(b[0]), jnp.zeros_like(b[0])), (u0, u1, u2, x), reverse=True)
    if perturb_singular:
        return solved
    nan = complex(np.nan, np.nan) if jnp.iscomplexobj(solved) else np.nan  # as XLA fills it
    return jnp.where(jnp.all(u0 != zero), solved, jnp.full_like(solved, nan))  # gtsv: info > 0


def _perturbed_pivot(perturb: jax.Array, pivot: jax.Array, rhs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A pivot below one that would overflow ``rhs / pivot`` moved away from zero by
    ``perturb`` (doubling each time), or both scaled up where it underflows (xLAGTS)."""
    real = jnp.finfo(pivot.dtype).dtype
    finfo = jnp.finfo(real)
    one = jnp.ones((), real)
    small = one / finfo.max
    safemin = jnp.where(small < finfo.tiny, finfo.tiny, small * (1 + finfo.eps)).astype(real)
    bignum = one / safemin
    largest = jnp.max(jnp.abs(rhs))
    step = jnp.copysign(jnp.maximum(jnp.abs(perturb), safemin), jnp.real(pivot))

    def moving(state):
        pivot, _, _, stop = state
        return (jnp.abs(pivot) < one) & ~stop

    def move(state):
        pivot, step, rhs, _ = state
        size = jnp.abs(pivot)
        tiny = size < safemin
        nudge = jnp.where(tiny, (size == 0) | (largest * safemin > size), largest > size * bignum)
        scale = tiny & ~nudge
        up = bignum.astype(pivot.dtype)  # (explicitly: a complex pivot, real steps)
        pivot = jnp.where(nudge, pivot + step.astype(pivot.dtype), jnp.where(scale, pivot * up, pivot))
        rhs = jnp.where(scale, rhs * up, rhs)
        return pivot, jnp.where(nudge, step * 2, step), rhs, ~nudge

    pivot, _, rhs, _ = lax.while_loop(moving, move, (pivot, step, rhs, jnp.zeros((), bool)))
    return pivot, rhs
