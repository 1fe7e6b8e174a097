"""The PJRT plugin: platform "polyblocks" for ``jax.jit``, implemented in Python with ctypes.

``plugin`` is the thin ``jax_plugins`` entry module; ``api`` builds the PJRT_Api table of
callbacks over ``client``, ``device``, ``buffer``, ``executable``, ``events`` and ``errors``.
"""
