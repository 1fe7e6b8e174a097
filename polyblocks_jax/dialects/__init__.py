"""Python modules for the upstream dialects registered without one (``amx``, ``x86vector``).

Wrapping an op, the MLIR bindings import ``mlir.dialects.<namespace>`` to find its class,
and remember only an import that succeeded: every op of such a dialect a stage iterated over
tried the import again (UNet: 312 tries, 11 ms a compile). ``polyblocks_jax.contexts``
adds this package to the bindings' search prefixes, after ``mlir.dialects``: the import
succeeds here once, and the ops stay plain ``OpView``s, as before.
"""
