"""Lowering Python callbacks for platform "polyblocks": jax.debug.print and jax.debug.callback,
jax.pure_callback, jax.experimental.io_callback (ordered or not), checkify's run-time checks.

JAX lowers each of them through ``jax._src.callback.emit_python_callback``, which knows the
cpu, cuda, rocm and tpu platforms only and leaves the callable to XLA's runtime. No public
API lets a platform lower callbacks, so we wrap that function: for our platform the
callable is registered with the runtime (runtime/host_callbacks.py), the lowering emits a
``stablehlo.custom_call`` to our target carrying its key (ordered ones thread JAX's token
through it), and JAX keeps the entry alive with the executable as a host callback (which
also keeps such programs out of its persistent cache: their code calls into this process).
Other platforms keep JAX's own lowering. debug_callback, debug_print and checkify's check
have rules for the cpu and gpu platforms only; ours are the cpu rules.

Callbacks run as on XLA CPU: on the calling thread, in program order, with numpy arrays;
the checks of what they return are JAX's, with JAX's messages.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from polyblocks_jax.runtime import host_callbacks

PLATFORM = "polyblocks"


def register() -> None:
    """Call after the platform is registered: JAX accepts rules for known platforms only."""
    from jax._src import callback as jax_callback  # emit_python_callback has no public alias
    from jax._src import checkify, debugging
    from jax._src.interpreters import mlir as internal_mlir
    from jax.interpreters import mlir

    original = jax_callback.emit_python_callback
    if getattr(original, "_polyblocks", False):
        return

    def emit_python_callback(ctx, callback, token, operands, operand_avals, result_avals, **params):
        if tuple(ctx.module_context.platforms) != (PLATFORM,):
            return original(ctx, callback, token, operands, operand_avals, result_avals, **params)
        return _emit(ctx, callback, token, operands, operand_avals, result_avals)

    emit_python_callback._polyblocks = True
    # debugging.py and checkify.py call it through the module, so this reaches every rule.
    jax_callback.emit_python_callback = emit_python_callback
    cpu_rules = internal_mlir._platform_specific_lowerings["cpu"]  # the rules XLA CPU uses
    for primitive in (debugging.debug_callback_p, debugging.debug_print_p, checkify.check_p):
        entry = cpu_rules.get(primitive)
        if entry is not None:
            mlir.register_lowering(primitive, entry.rule, platform=PLATFORM, inline=entry.inline)


def _emit(ctx, callback: Callable, token, operands: Sequence, operand_avals: Sequence,
          result_avals: Sequence) -> tuple[list, Any, host_callbacks.HostCallback]:
    """What ``emit_python_callback`` returns: the results, the token after the call (None
    when unordered) and the host callback object."""
    from jax.interpreters import mlir
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    entry = host_callbacks.register(_checked(callback, result_avals),
                                    [_spec(a) for a in operand_avals], [_spec(a) for a in result_avals])
    ctx.module_context.add_host_callback(entry)
    operands, result_types = list(operands), [mlir.aval_to_ir_type(ctx.module_context, a) for a in result_avals]
    if token is not None:
        operands, result_types = [token, *operands], [stablehlo.TokenType.get(), *result_types]
    call = stablehlo.CustomCallOp(
        result_types, operands, host_callbacks.TARGET, has_side_effect=True,
        backend_config=ir.StringAttr.get(str(entry.key)),
        api_version=ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 1))
    results = list(call.results)
    if token is not None:
        token, *results = results
    return results, token, entry


def _spec(aval) -> host_callbacks.Spec:
    """Shape and numpy dtype of the buffer holding ``aval`` (a PRNG key's words, float0 as bool)."""
    from jax._src import core  # physical_aval has no public alias
    from jax import dtypes
    physical = core.physical_aval(aval)
    dtype = np.dtype(np.bool_) if physical.dtype == dtypes.float0 else np.dtype(physical.dtype)
    return tuple(physical.shape), dtype


def _checked(callback: Callable, result_avals: Sequence) -> Callable:
    """``callback`` with the checks JAX applies to what it returns, raising JAX's errors."""
    from jax import dtypes

    def run(*args):
        values = callback(*args)
        if len(values) != len(result_avals):
            raise RuntimeError("Mismatched number of outputs from callback. "
                               f"Expected: {len(result_avals)}, Actual: {len(values)}")
        checked = []
        for i, (value, aval) in enumerate(zip(values, result_avals)):
            value = np.asarray(value)
            value = value.astype(dtypes.canonicalize_dtype(value.dtype), copy=False)
            if value.shape != aval.shape:
                raise RuntimeError(f"Incorrect output shape for return value #{i}: "
                                   f"Expected: {aval.shape}, Actual: {value.shape}")
            if value.dtype != aval.dtype:
                raise RuntimeError(f"Incorrect output dtype for return value #{i}: "
                                   f"Expected: {aval.dtype}, Actual: {value.dtype}")
            checked.append(value)
        return checked
    return run
