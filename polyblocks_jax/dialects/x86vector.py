"""The ``x86vector`` dialect has no op classes in Python (see ``polyblocks_jax.dialects``)."""
