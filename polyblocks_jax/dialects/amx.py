"""The ``amx`` dialect has no op classes in Python (see ``polyblocks_jax.dialects``)."""
