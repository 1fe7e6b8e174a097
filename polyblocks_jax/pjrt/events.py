"""PJRT_Event: everything runs synchronously, so almost every event is born ready.

``READY`` is one immortal event shared by all results: Event_Destroy on it does
nothing, which keeps the per-call path free of allocations. A ``PendingEvent`` exists
only for zero-copy host buffers, whose "done with host buffer" event fires when the
device buffer lets go of the host memory.
"""
from __future__ import annotations

import ctypes

from polyblocks_jax.pjrt import handles

ON_READY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)  # (PJRT_Error*, user_arg)


class ReadyEvent:
    ready = True
    immortal = True

    def on_ready(self, callback: int, user_arg: int) -> None:
        ON_READY(callback)(None, user_arg)


class PendingEvent:
    """Ready once ``fire`` is called; callbacks registered before then run at that moment."""
    immortal = False

    def __init__(self) -> None:
        self.ready = False
        self._callbacks: list[tuple[int, int]] = []

    def on_ready(self, callback: int, user_arg: int) -> None:
        if self.ready:
            ON_READY(callback)(None, user_arg)
        else:
            self._callbacks.append((callback, user_arg))

    def fire(self) -> None:
        if self.ready:
            return
        self.ready = True
        callbacks, self._callbacks = self._callbacks, []
        for callback, user_arg in callbacks:
            ON_READY(callback)(None, user_arg)


READY_EVENT = ReadyEvent()
READY = handles.register(READY_EVENT)
