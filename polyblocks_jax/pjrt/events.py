"""PJRT_Event: the host device runs synchronously, so its events are born ready.

``READY`` is one immortal event shared by all results: Event_Destroy on it does
nothing, which keeps the per-call path free of allocations. A ``PendingEvent`` exists
only for zero-copy host buffers, whose "done with host buffer" event fires when the
device buffer lets go of the host memory. A ``CudaEvent`` is a GPU device's: ready
when the CUDA event recorded on its stream has completed.
"""
from __future__ import annotations

import concurrent.futures
import ctypes

from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.errors import from_exception

ON_READY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)  # (PJRT_Error*, user_arg)


class ReadyEvent:
    ready = True
    immortal = True

    def on_ready(self, callback: int, user_arg: int) -> None:
        ON_READY(callback)(None, user_arg)

    def wait(self) -> None:
        """Ready already."""


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

    def wait(self) -> None:
        if not self.ready:
            raise RuntimeError("polyblocks PJRT: awaiting a host-buffer event that only fires on buffer release")


# Callbacks of CUDA events still pending run here, in order, once the event completes.
_WAITER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="polyblocks-cuda-events")


class CudaEvent:
    """A CUDA event recorded on a GPU device's stream now; one object may back several handles."""
    immortal = False

    def __init__(self, gpu) -> None:
        self.gpu = gpu  # nvptx.runtime.Device
        self.event = gpu.record_event()
        self._done = False

    @property
    def ready(self) -> bool:
        self._done = self._done or self.gpu.event_done(self.event)
        return self._done

    def wait(self) -> None:
        if not self._done:
            self.gpu.wait_event(self.event)
            self._done = True

    def on_ready(self, callback: int, user_arg: int) -> None:
        if self.ready:
            ON_READY(callback)(None, user_arg)
        else:
            _WAITER.submit(self._call_when_done, callback, user_arg)

    def _call_when_done(self, callback: int, user_arg: int) -> None:
        try:
            self.wait()
        except Exception as e:  # noqa: BLE001 (the callback must run: jaxlib waits on it)
            ON_READY(callback)(from_exception(e), user_arg)
            return
        ON_READY(callback)(None, user_arg)

    def __del__(self) -> None:
        try:
            self.gpu.destroy_event(self.event)
        except Exception:  # noqa: BLE001 (at interpreter exit the driver may be gone)
            pass


READY_EVENT = ReadyEvent()
READY = handles.register(READY_EVENT, handles.READY_EVENT)


def handle_of(event) -> int:
    """A PJRT_Event handle for ``event``: the shared one when ready, else a new one jaxlib owns."""
    return READY if event is READY_EVENT else handles.register(event)
