"""Errors, events and the plugin itself."""
from __future__ import annotations

import ctypes

from pypjrt._abi import pjrt_0_114 as abi

from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.callbacks import implements
from polyblocks_jax.pjrt.named_values import NamedValues

_FALLBACK = ctypes.create_string_buffer(b"polyblocks PJRT: unknown error")


# The error functions must never fail and may run during interpreter finalization, when
# module globals are gone: everything they use is bound as a default argument.
@implements("PJRT_Error_Destroy")
def error_destroy(args, _get=handles.LIVE.get, _release=handles.release):
    error = _get(args.error)
    if error is not None and not error.immortal:
        _release(args.error)


@implements("PJRT_Error_Message")
def error_message(args, _get=handles.LIVE.get, _fallback=_FALLBACK, _addressof=ctypes.addressof):
    error = _get(args.error)
    buffer = error.message if error is not None else _fallback
    args.message, args.message_size = _addressof(buffer), len(buffer.value)


@implements("PJRT_Error_GetCode")
def error_get_code(args, _get=handles.LIVE.get, _internal=abi.PJRT_Error_Code_INTERNAL):
    error = _get(args.error)
    args.code = error.code if error is not None else _internal


@implements("PJRT_Error_ForEachPayload")
def error_for_each_payload(args):
    """Our errors carry no payloads."""


@implements("PJRT_Plugin_Initialize")
def plugin_initialize(args):
    """Nothing to do: the client is created lazily."""


_ATTRIBUTES: list[NamedValues] = []


def plugin_attributes_values() -> NamedValues:
    if not _ATTRIBUTES:
        from jaxlib.mlir.dialects import stablehlo  # JAX keeps the artifact at this version
        current = [int(x) for x in stablehlo.get_current_version().split(".")]
        minimum = [int(x) for x in stablehlo.get_minimum_version().split(".")]
        _ATTRIBUTES.append(NamedValues({
            "xla_version": 2, "stablehlo_current_version": current, "stablehlo_minimum_version": minimum,
        }))
    return _ATTRIBUTES[0]


@implements("PJRT_Plugin_Attributes")
def plugin_attributes(args):
    values = plugin_attributes_values()
    args.attributes, args.num_attributes = values.address, values.count


@implements("PJRT_Event_Destroy")
def event_destroy(args, _get=handles.LIVE.get, _release=handles.release):
    event = _get(args.event)
    if event is not None and not event.immortal:
        _release(args.event)


@implements("PJRT_Event_IsReady")
def event_is_ready(args):
    args.is_ready = handles.lookup(args.event).ready


@implements("PJRT_Event_Error")
def event_error(args):
    """Events never carry errors: failures are returned by the call that would create them."""


@implements("PJRT_Event_Await")
def event_await(args):
    handles.lookup(args.event).wait()


@implements("PJRT_Event_OnReady")
def event_on_ready(args):
    handles.lookup(args.event).on_ready(args.callback, args.user_arg)

