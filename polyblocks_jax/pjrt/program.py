"""What the plugin reads from a program besides compiling it: which inputs are donated."""
from __future__ import annotations

DONATION_ATTRS = ("tf.aliasing_output", "jax.buffer_donor")


def donated_inputs(code: bytes) -> frozenset[int]:
    """Indices of ``main``'s arguments that JAX marked as donated (aliased to an output)."""
    from polyblocks_jax.stablehlo_import import reader  # jaxlib MLIR, loaded on first compile
    ctx = reader.new_context()
    module = reader.parse(code, ctx)
    with ctx:
        for op in module.body.operations:
            if op.operation.name == "func.func" and op.attributes["sym_name"].value == "main":
                return _donated_args(op)
    return frozenset()


def _donated_args(func) -> frozenset[int]:
    if "arg_attrs" not in func.attributes:
        return frozenset()
    donated = set()
    for i, attrs in enumerate(func.attributes["arg_attrs"]):
        if any(name in attrs for name in DONATION_ATTRS):
            donated.add(i)
    return frozenset(donated)
