"""What JAX's lowering needs to know about platform "polyblocks".

Lowering rules: for every primitive whose CPU lowering is a LAPACK or runtime custom
call (cholesky, lu, qr, svd, triangular_solve, threefry2x32, random_gamma, ...), JAX also
registers a generic rule written in plain StableHLO, and a platform without its own rule
(like "polyblocks") gets the generic one. The primitives that only have platform rules
(eig, eigh, schur, hessenberg, tridiagonal, geqp3, debug_callback, debug_print) fail at
lowering with JAX's own error naming the primitive and the platform ("MLIR translation
rule for primitive 'eigh' not found for platform polyblocks").

erf and erfc: a program reaches a PJRT plugin as a portable artifact, and jaxlib expands
every chlo op into StableHLO on the way (erfc: three approximations, two divisions and a
select per element). Our rule for platform "polyblocks" wraps the chlo op in a
``stablehlo.composite`` named after it, whose decomposition is the chlo op alone: the
composite survives serialization, and the importer computes it with its own rational
function where it has one (stablehlo_import/elementwise.py), else runs the decomposition.

Donation: JAX only emits input/output aliasing for platforms it lists as supporting
donation; the list is internal (``mlir._platforms_with_donation``) and no public API
extends it, so we append to it. The compiler writes each aliased output into its donated
argument's buffer and Execute hands that memory to the output (see executable.py).
"""
from __future__ import annotations

PLATFORM = "polyblocks"


def register() -> None:
    """Call after the platform is registered: JAX accepts rules for known platforms only."""
    from jax._src.interpreters import mlir as internal_mlir
    donation = getattr(internal_mlir, "_platforms_with_donation", None)
    if isinstance(donation, list) and PLATFORM not in donation:
        donation.append(PLATFORM)
    _register_preserved_chlo()


def _register_preserved_chlo() -> None:
    from jax import lax
    from jax.interpreters import mlir
    from jaxlib.mlir.dialects import chlo
    for primitive, build in ((lax.erf_p, chlo.erf), (lax.erfc_p, chlo.erfc)):
        mlir.register_lowering(primitive, _composite_rule(f"chlo.{primitive.name}", build), platform=PLATFORM)


def _composite_rule(name: str, build):
    """A rule lowering a unary primitive to ``stablehlo.composite name`` around ``build``."""
    from jax.interpreters import mlir
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import func, stablehlo

    def rule(ctx: mlir.LoweringRuleContext, x: ir.Value) -> list[ir.Value]:
        result_type = x.type  # elementwise and unary
        module = ctx.module_context
        with ir.InsertionPoint(module.module.body):
            decomposition = func.FuncOp(name, ir.FunctionType.get([x.type], [result_type]),
                                        visibility="private")
        symbol = module.symbol_table.insert(decomposition)  # uniqued: one per use
        with ir.InsertionPoint(decomposition.add_entry_block()):
            func.ReturnOp([build(decomposition.arguments[0])])
        composite = stablehlo.CompositeOp(
            [result_type], [x], name=ir.StringAttr.get(name),
            decomposition=ir.FlatSymbolRefAttr.get(ir.StringAttr(symbol).value),
            composite_attributes=ir.DictAttr.get({}),
            version=ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 0))
        return composite.results
    return rule
