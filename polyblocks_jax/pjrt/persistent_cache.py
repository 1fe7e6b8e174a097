"""Let JAX's persistent compilation cache serve platform "polyblocks".

``jax._src.compilation_cache.is_cache_used`` only accepts a hard-coded list of platforms
(tpu, gpu, cpu, neuron) and no public API extends it, so we wrap it: for our backend the
cache is used whenever the user enabled it. Our executables serialize (Executable_Serialize)
and load back (DeserializeAndLoad); a bad entry fails to load and JAX recompiles.
"""
from __future__ import annotations

PLATFORM = "polyblocks"


def register() -> None:
    from jax._src import compilation_cache
    original = compilation_cache.is_cache_used
    if getattr(original, "_polyblocks", False):
        return
    enabled = getattr(compilation_cache, "_is_cache_enabled", None) or compilation_cache.is_persistent_cache_enabled

    def is_cache_used(backend) -> bool:
        if getattr(backend, "platform", None) == PLATFORM:
            return bool(enabled())
        return original(backend)
    is_cache_used._polyblocks = True
    compilation_cache.is_cache_used = is_cache_used
