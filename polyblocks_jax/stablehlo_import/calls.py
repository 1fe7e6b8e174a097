"""Ops that only route values: calls and composites (inlined), barriers and sharding marks.

They route complex values (complex_values.Pair) as they route real ones.

A program compiled here runs on one host device, so Shardy's sharding annotations
and XLA's scheduling barriers carry no meaning and their operands pass through.
"""
from __future__ import annotations

from jaxlib.mlir import ir as jir

from polyblocks_jax.stablehlo_import.registry import COMPOSITES, converts, converts_complex


@converts("func.call")
@converts_complex("func.call")
def call(cx, op):
    return cx.inline_call(jir.FlatSymbolRefAttr(op.attr("callee")).value, op.operands)


@converts("stablehlo.composite")
@converts_complex("stablehlo.composite")
def composite(cx, op):
    """A named group of ops (``composite_attributes`` describe it): computed our way where
    we have one for its name and types, else its decomposition runs (always for narrow
    types, whose ops the decomposition widens one by one)."""
    narrow = any(s.dtype.is_narrow for s in op.operand_specs + op.result_specs)
    own = None if narrow else COMPOSITES.get(jir.StringAttr(op.attr("name")).value)
    results = own(cx, op) if own else None
    if results is not None:
        return results
    return cx.inline_call(jir.FlatSymbolRefAttr(op.attr("decomposition")).value, op.operands)


@converts("stablehlo.optimization_barrier", "sdy.reshard", "sdy.propagation_barrier")
@converts_complex("stablehlo.optimization_barrier", "sdy.reshard", "sdy.propagation_barrier")
def identity(cx, op):
    # optimization_barrier only stops XLA from moving computations across it; the sdy ops
    # describe how data is laid out over a mesh (sdy.sharding_constraint is converted in
    # custom_call.py, beside the other sharding marks): all are identities on one device.
    return list(op.operands)


@converts("sdy.sharding_group")
def sharding_group(cx, op):
    return []  # ties values to a sharding group; it has no results
