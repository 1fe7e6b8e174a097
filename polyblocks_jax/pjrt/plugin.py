"""The ``jax_plugins`` entry module: registers platform "polyblocks" with JAX.

``initialize()`` is cheap (no compiler import until the first compile) and never breaks
``import jax``: on failure it logs and returns, and the platform is simply absent.
Its priority is below XLA CPU's (0), so XLA stays the default backend and polyblocks
runs when asked for: ``JAX_PLATFORMS=polyblocks`` or data placed on its device.
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

PLATFORM = "polyblocks"
PRIORITY = -100


def initialize() -> None:
    try:
        from jax._src import xla_bridge  # register_plugin has no public alias
        from polyblocks_jax.pjrt import api, host_callbacks, lowering_rules, persistent_cache
        persistent_cache.register()
        logging.getLogger(xla_bridge.__name__).addFilter(_quiet_unless_requested)
        xla_bridge.register_plugin(PLATFORM, priority=PRIORITY, c_api=api.capsule())
        lowering_rules.register()
        host_callbacks.register()
    except Exception as e:  # noqa: BLE001 (a broken install must not break `import jax`)
        logger.warning("polyblocks PJRT plugin not registered: %s: %s", type(e).__name__, e)


def _quiet_unless_requested(record: logging.LogRecord) -> bool:
    """JAX warns that a plugin's platform is experimental when it starts the backend, which
    it does for every program when ``JAX_PLATFORMS`` is unset: a program that never asks
    for polyblocks should print what it printed before the package was installed."""
    if f"Platform '{PLATFORM}' is experimental" not in record.getMessage():
        return True
    import jax
    return PLATFORM in (jax.config.jax_platforms or "").split(",")
