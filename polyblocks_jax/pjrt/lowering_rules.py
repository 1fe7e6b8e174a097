"""What JAX's lowering needs to know about platform "polyblocks".

Lowering rules: for every primitive whose CPU lowering is a LAPACK or runtime custom
call (cholesky, lu, qr, triangular_solve, threefry2x32, random_gamma, ...), JAX also
registers a generic rule, and a platform without its own rule (like "polyblocks") gets the
generic one: StableHLO loops (lu, threefry2x32), StableHLO's own ops (stablehlo.cholesky
and triangular_solve) or XLA's custom calls for its own expansions (qr: "Qr" and
"ProductOfElementaryHouseholderReflectors"), computed in stablehlo_import/linear_algebra.py.
lu's generic rule factors blocks of 128 columns, each by a while loop of gathers and
scatters (27 KB of StableHLO for 8x8), and updates the rest by a triangular solve and a
matmul; the CPU's rule is one LAPACK getrf call, which the importer computes blocked as
LAPACK does (stablehlo_import/lu.py, LAPACK's pivots, as XLA's CPU gives them): we register
the CPU's rule.
eigh has platform rules only: we register the TPU's (QDWH, ending in XLA's "Eigh" custom
call: stablehlo_import/symmetric_eigen.py). svd's generic rule is QDWH and eigh (slow to
compile, and to run beyond eigh's 256-row Jacobi blocks); we register the CPU's, a
LAPACK gesdd call the importer computes by one-sided Jacobi (singular_values.py). hessenberg,
tridiagonal, schur and eig have LAPACK rules only (eig a cuSOLVER one too): we register
the CPU's, whose gehrd, sytrd (hetrd), gees and geev calls the importer computes
(stablehlo_import/hessenberg.py, schur.py, nonsymmetric_eigen.py). tridiagonal_solve
pivots, and perturbs singular systems where asked, in JAX (tridiagonal_solve.py). The other
primitive with platform rules only (geqp3) fails at lowering with JAX's own error naming
the primitive and the platform ("MLIR translation rule for primitive 'geqp3' not found
for platform polyblocks"); callbacks are host_callbacks.py's.

erf, erfc, top_k, argmax and argmin: a program reaches a PJRT plugin as a portable
artifact, and jaxlib expands every chlo op into StableHLO on the way (erfc: three
approximations, two divisions and a select per element; top_k: a sort of the whole row);
argmax is a reduce of values and indices together. Our rules for platform "polyblocks" wrap
what JAX's own rule emits in a ``stablehlo.composite`` named after the op, whose
decomposition is that output: the composite survives serialization, and the importer
computes it its own way where it has one (stablehlo_import/elementwise.py, sort.py,
reduce.py), else runs the decomposition. (top_k along another axis than the last, or with
a symbolic k, and argmax over several axes keep JAX's rule alone.)

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
    _register_eigh()
    _register_lapack_rules()
    _register_svd()
    _register_tridiagonal_solve()


def _register_eigh() -> None:
    """eigh as TPUs lower it: JAX's QDWH divide and conquer in StableHLO, its blocks ending
    in XLA's Jacobi "Eigh" custom call (stablehlo_import/symmetric_eigen.py). The QR
    algorithm a caller may name (LAPACK's on the CPU; TPUs reject it) is that one too: the
    same decomposition by another method. The rule is internal to JAX; where a JAX version
    moves it, eigh keeps failing at lowering as before."""
    from jax.interpreters import mlir
    try:
        from jax._src.lax import linalg
        from jax._src.tpu.linalg import eigh
        tpu_rule, qr = eigh._eigh_tpu_lowering, linalg.EighImplementation.QR
    except (ImportError, AttributeError):
        return

    def rule(ctx, operand, *, algorithm, **params):
        return tpu_rule(ctx, operand, algorithm=None if algorithm == qr else algorithm, **params)
    mlir.register_lowering(linalg.eigh_p, rule, platform=PLATFORM)


def _register_lapack_rules() -> None:
    """lu, hessenberg, tridiagonal, eig and schur as the CPU lowers them: LAPACK's getrf,
    gehrd, sytrd (hetrd), geev and gees custom calls, which the importer computes. The CPU's
    rules are internal to JAX (no public API returns a platform's rule); where a JAX version
    moves them, lu keeps its generic rule and the others keep failing at lowering as before."""
    from jax.interpreters import mlir
    from jax._src.interpreters import mlir as internal_mlir
    try:
        from jax._src.lax import linalg
        primitives = (linalg.lu_p, linalg.hessenberg_p, linalg.tridiagonal_p, linalg.eig_p,
                      linalg.schur_p)
        rules = [internal_mlir._platform_specific_lowerings["cpu"][p].rule for p in primitives]
    except (ImportError, AttributeError, KeyError):
        return
    for primitive, rule in zip(primitives, rules):
        mlir.register_lowering(primitive, rule, platform=PLATFORM)


def _register_svd() -> None:
    """svd as the CPU lowers it: LAPACK's gesdd (gesvd for the QR algorithm), computed by
    one-sided Jacobi (stablehlo_import/singular_values.py). The Jacobi algorithm, which the
    CPU's rule refuses, is that gesdd too; the polar one (QDWH), and a subset of the
    values (which LAPACK's rule refuses), keep JAX's generic rule. Internal to JAX as the
    others are; where a JAX version moves the rule, svd keeps its generic one."""
    from jax.interpreters import mlir
    from jax._src.interpreters import mlir as internal_mlir
    try:
        from jax._src.lax import linalg
        lapack_rule = internal_mlir._platform_specific_lowerings["cpu"][linalg.svd_p].rule
        algorithms = linalg.SvdAlgorithm
    except (ImportError, AttributeError, KeyError):
        return
    generic = mlir._lowerings[linalg.svd_p].rule

    def rule(ctx, operand, *, full_matrices, compute_uv, subset_by_index, algorithm=None):
        m, n = ctx.avals_in[0].shape[-2:]
        whole = subset_by_index is None or subset_by_index == (0, min(m, n))
        if whole and algorithm != algorithms.POLAR:
            return lapack_rule(ctx, operand, full_matrices=full_matrices, compute_uv=compute_uv,
                               subset_by_index=subset_by_index,
                               algorithm=None if algorithm == algorithms.JACOBI else algorithm)
        return generic(ctx, operand, full_matrices=full_matrices, compute_uv=compute_uv,
                       subset_by_index=subset_by_index)  # polar is its only algorithm
    mlir.register_lowering(linalg.svd_p, rule, platform=PLATFORM)


def _register_tridiagonal_solve() -> None:
    """tridiagonal_solve by elimination with row exchanges, and with ``perturb_singular``
    (pjrt/tridiagonal_solve.py), where JAX's rule for platforms without a library does neither."""
    from jax.interpreters import mlir
    from jax._src.lax import linalg
    from polyblocks_jax.pjrt.tridiagonal_solve import tridiagonal_solve
    mlir.register_lowering(linalg.tridiagonal_solve_p, mlir.lower_fun(tridiagonal_solve, multiple_results=False),
                           platform=PLATFORM)


def _register_preserved_chlo() -> None:
    from jax import lax
    from jax.interpreters import mlir
    for primitive, name, wrapped in ((lax.erf_p, "chlo.erf", None), (lax.erfc_p, "chlo.erfc", None),
                                     (lax.top_k_p, "chlo.top_k", _top_k_along_the_last_axis),
                                     (lax.argmax_p, "polyblocks.argmax", _one_axis),
                                     (lax.argmin_p, "polyblocks.argmin", _one_axis)):
        # JAX's own rule for every platform: no public API returns it, the module re-exports it
        default = mlir._lowerings[primitive].rule
        mlir.register_lowering(primitive, _composite_rule(name, default, wrapped), platform=PLATFORM)


def _top_k_along_the_last_axis(ctx, operand, *, k, axis) -> dict | None:
    return {} if isinstance(k, int) and axis in (-1, len(ctx.avals_in[0].shape) - 1) else None


def _one_axis(ctx, operand, *, axes, index_dtype) -> dict | None:
    """argmax / argmin along one axis: the composite names it."""
    from jaxlib.mlir import ir
    return {"axis": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), axes[0])} if len(axes) == 1 else None


def _composite_rule(name: str, default, wrapped=None):
    """A rule lowering as ``default`` does, inside a ``stablehlo.composite`` called ``name``
    whose attributes ``wrapped(ctx, *args, **params)`` gives (None: ``default`` alone)."""
    from jax.interpreters import mlir
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import func, stablehlo

    def rule(ctx: mlir.LoweringRuleContext, *args: ir.Value, **params) -> list[ir.Value]:
        attributes = {} if wrapped is None else wrapped(ctx, *args, **params)
        if attributes is None:
            return default(ctx, *args, **params)
        module = ctx.module_context
        operand_types = [a.type for a in args]
        with ir.InsertionPoint(module.module.body):
            decomposition = func.FuncOp(name, ir.FunctionType.get(operand_types, []), visibility="private")
        symbol = module.symbol_table.insert(decomposition)  # uniqued: one per use
        with ir.InsertionPoint(decomposition.add_entry_block()):
            results, _ = mlir.ir_tree_registry.flatten(default(ctx, *decomposition.arguments, **params))
            func.ReturnOp(results)
        result_types = [r.type for r in results]
        decomposition.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(operand_types, result_types))
        composite = stablehlo.CompositeOp(
            result_types, list(args), name=ir.StringAttr.get(name),
            decomposition=ir.FlatSymbolRefAttr.get(ir.StringAttr(symbol).value),
            composite_attributes=ir.DictAttr.get(attributes),
            version=ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 0))
        return list(composite.results)
    return rule
