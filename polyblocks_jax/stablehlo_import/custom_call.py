"""stablehlo.custom_call: the targets JAX emits for a generic platform.

Sharding and placement annotations are identities on one device. ApproxTopK is what
``lax.approx_max_k``/``approx_min_k`` emit; XLA CPU computes it exactly (sort, then the
first k), and so do we. XLA's Householder QR ("Qr") and the product of its reflectors are
what jnp.linalg.qr lowers to off LAPACK: computed as LAPACK's geqrf and orgqr
(householder.py); so are the LAPACK routines a program lowered for the CPU calls for
them (lapack.py). Those and the annotations take complex operands too. Calls back into
Python are host_callbacks.py's. Any other target (other LAPACK routines, XLA's own
callbacks, ...) raises UnsupportedError naming it.
"""
from __future__ import annotations

from jaxlib.mlir import ir as jir

from polyblocks_jax.runtime import host_callbacks as runtime_callbacks
from polyblocks_jax.stablehlo_import import host_callbacks, householder, lapack, sort, symmetric_eigen
from polyblocks_jax.stablehlo_import.registry import converts, converts_complex

# Targets that only annotate their operands (sharding, memory placement, ...); with one
# device and one memory space each returns its operands unchanged.
IDENTITY_TARGETS = frozenset({
    "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape",
    "annotate_device_placement", "MoveToHost", "MoveToDevice",
    "xla.sdy.FuncResultSharding",
})


# XLA's own decompositions, which JAX's generic rules call (jnp.linalg.qr: geqrf, orgqr;
# eigh's QDWH: Jacobi on its blocks).
_DECOMPOSITIONS = {"Qr": householder.qr_call,
                   "ProductOfElementaryHouseholderReflectors": householder.householder_product_call,
                   "Eigh": symmetric_eigen.eigh_call}


@converts("stablehlo.custom_call")
def custom_call(cx, op):
    target = jir.StringAttr(op.attr("call_target_name")).value
    if target in IDENTITY_TARGETS:
        return _identity(op, target)
    if target == "shape_assertion":  # shapes are static here: the assertion holds
        return []
    if target == "dce_sink":  # keeps its operands from XLA's dead-code elimination; no results, no effect
        return []
    if target == "ApproxTopK":
        return _approx_top_k(cx, op)
    if target == runtime_callbacks.TARGET:
        return host_callbacks.call(cx, op)
    if target in _DECOMPOSITIONS:
        return _DECOMPOSITIONS[target](op)
    if (results := lapack.lapack_call(op, target)) is not None:
        return results
    raise op.unsupported(f"custom_call target {target!r} has no lowering")


@converts_complex("stablehlo.custom_call")
def complex_custom_call(cx, op):
    """The targets that compute on complex values as on real ones."""
    target = jir.StringAttr(op.attr("call_target_name")).value
    if target in IDENTITY_TARGETS:
        return _identity(op, target)
    if target in _DECOMPOSITIONS:
        return _DECOMPOSITIONS[target](op)
    if (results := lapack.lapack_call(op, target)) is not None:
        return results
    raise op.unsupported(f"custom_call target {target!r} has no lowering for complex types")


@converts("sdy.sharding_constraint")
def sharding_constraint(cx, op):
    return list(op.operands)  # a sharding mark: the identity on one device


def _identity(op, target: str):
    if [s.shape for s in op.operand_specs] != [s.shape for s in op.result_specs] or \
            [s.dtype for s in op.operand_specs] != [s.dtype for s in op.result_specs]:
        raise op.unsupported(f"custom_call {target!r} changes types: "
                             f"{list(map(str, op.operand_specs))} -> {list(map(str, op.result_specs))}")
    return list(op.operands)


def _approx_top_k(cx, op):
    """Operands: N inputs, then N init values (unused: XLA CPU's fallback is an exact sort)."""
    config = jir.DictAttr(op.attr("mhlo.backend_config"))
    k = jir.IntegerAttr(config["top_k"]).value
    dimension = jir.IntegerAttr(config["reduction_dim"]).value
    n = len(op.result_specs)
    (comparator_name,) = [jir.FlatSymbolRefAttr(a).value for a in jir.ArrayAttr(op.attr("called_computations"))]
    comparator = cx.functions[comparator_name].regions[0].blocks[0]
    inputs, shape = list(op.operands[:n]), op.operand_specs[0].shape
    ordered = sort.merge_sort(inputs, shape, dimension, sort.comparator_less(cx, comparator, op.operand_specs[:n]))
    return [sort.leading(v, dimension, k) for v in ordered]
