"""The runtime: load and run compiled programs where no compiler is installed.

Nothing here imports MLIR (neither ``mlir`` nor ``jaxlib.mlir``) nor jax: a serialized
executable runs with numpy, ml_dtypes and the OpenMP runtime only. ``executable`` holds
the host program and its serialized form, ``specs`` the signatures every target shares.
The compiler (``polyblocks_jax.compiler``) builds what this package runs.
"""
