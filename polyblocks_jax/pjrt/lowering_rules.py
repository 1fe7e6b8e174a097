"""What JAX's lowering needs to know about platform "polyblocks".

Lowering rules: for every primitive whose CPU lowering is a LAPACK or runtime custom
call (cholesky, lu, qr, svd, triangular_solve, threefry2x32, random_gamma, ...), JAX also
registers a generic rule written in plain StableHLO, and a platform without its own rule
(like "polyblocks") gets the generic one: nothing to register. The primitives that only
have platform rules (eig, eigh, schur, hessenberg, tridiagonal, geqp3, debug_callback,
debug_print) fail at lowering with JAX's own error naming the primitive and the platform
("MLIR translation rule for primitive 'eigh' not found for platform polyblocks").

Donation: JAX only emits input/output aliasing for platforms it lists as supporting
donation; the list is internal (``mlir._platforms_with_donation``) and no public API
extends it, so we append to it. The compiler writes each aliased output into its donated
argument's buffer and Execute hands that memory to the output (see executable.py).
"""
from __future__ import annotations

PLATFORM = "polyblocks"


def register() -> None:
    from jax._src.interpreters import mlir
    donation = getattr(mlir, "_platforms_with_donation", None)
    if isinstance(donation, list) and PLATFORM not in donation:
        donation.append(PLATFORM)
