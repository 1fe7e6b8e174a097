"""Several processes (``jax.distributed.initialize``): this process's place and the global topology.

JAX creates the client of a multi-process run with this process's ``node_id`` and the
``num_nodes`` as create options, and callbacks into the key-value store of its coordination
service. Each node publishes its devices' summaries (kind, target: ``Device.summary``) under
its id and reads every other node's: all nodes then list the same devices with the same ids,
node-major (node 0's first), each with its process index. Data moves between nodes through MPI (runtime/transport.py),
not through this store, which JAX meant for small agreements.
"""
from __future__ import annotations

import ctypes
import dataclasses
import json

from pypjrt._abi import pjrt_0_114 as abi

from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.errors import Error, PjrtError, invalid
from polyblocks_jax.runtime.foreign_memory import array_type

TOPOLOGY_KEY = "polyblocks/topology/{node}"
TIMEOUT_MS = 10 * 60 * 1000  # a process may create its client minutes after the others (imports, a busy machine)

_GET = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(abi.PJRT_KeyValueGetCallback_Args))
_PUT = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(abi.PJRT_KeyValuePutCallback_Args))
_DELETE_VALUE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _callback_error(code: int, message: int, size: int) -> int:
    """PJRT_CallbackError: the store reports its failures as our PJRT_Error objects."""
    return handles.register(Error(code, ctypes.string_at(message, size).decode("utf-8", "replace")))


# Alive as long as the process: the store's callbacks may call it at any time.
_CALLBACK_ERROR = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)(_callback_error)


@dataclasses.dataclass(frozen=True)
class Node:
    """This process's index among ``count`` processes."""
    index: int = 0
    count: int = 1


class KeyValueStore:
    """JAX's key-value store, through the callbacks PJRT_Client_Create received."""

    def __init__(self, get: int, get_arg: int | None, put: int, put_arg: int | None) -> None:
        self._get, self._get_arg = _GET(get), get_arg
        self._put, self._put_arg = _PUT(put), put_arg

    def put(self, key: str, value: bytes) -> None:
        key_bytes, value_buffer = key.encode(), ctypes.create_string_buffer(value, len(value))
        args = abi.PJRT_KeyValuePutCallback_Args(
            struct_size=abi.PJRT_KeyValuePutCallback_Args_STRUCT_SIZE, key=ctypes.cast(key_bytes, ctypes.c_void_p),
            key_size=len(key_bytes), value=ctypes.addressof(value_buffer), value_size=len(value),
            callback_error=ctypes.cast(_CALLBACK_ERROR, ctypes.c_void_p), user_arg=self._put_arg)
        _raise_if_error(self._put(ctypes.byref(args)), f"putting {key!r}")

    def get(self, key: str, timeout_ms: int = TIMEOUT_MS) -> bytes:
        """The value under ``key``, waiting up to ``timeout_ms`` for a node to put it."""
        key_bytes = key.encode()
        args = abi.PJRT_KeyValueGetCallback_Args(
            struct_size=abi.PJRT_KeyValueGetCallback_Args_STRUCT_SIZE, key=ctypes.cast(key_bytes, ctypes.c_void_p),
            key_size=len(key_bytes), timeout_in_ms=timeout_ms,
            callback_error=ctypes.cast(_CALLBACK_ERROR, ctypes.c_void_p), user_arg=self._get_arg)
        _raise_if_error(self._get(ctypes.byref(args)), f"getting {key!r}")
        value = ctypes.string_at(args.value, args.value_size) if args.value_size else b""
        if args.value_deleter_callback:
            _DELETE_VALUE(args.value_deleter_callback)(args.value)
        return value


def _raise_if_error(error: int | None, what: str) -> None:
    if error:
        failure = handles.release(error)
        raise PjrtError(failure.code, f"polyblocks PJRT: JAX's key-value store failed {what}: "
                                      f"{failure.message.value.decode('utf-8', 'replace')}")


def node_and_store(args) -> tuple[Node, KeyValueStore | None]:
    """PJRT_Client_Create's ``args``: the node and, for several nodes, the store."""
    options = _create_options(args.create_options, args.num_options)
    node = Node(int(options.get("node_id", 0)), int(options.get("num_nodes", 1)))
    if not 0 <= node.index < node.count:
        raise invalid(f"node_id {node.index} of {node.count} nodes")
    if node.count == 1:
        return node, None
    if not (args.kv_get_callback and args.kv_put_callback):
        raise invalid(f"{node.count} nodes without a key-value store to agree on their devices")
    return node, KeyValueStore(args.kv_get_callback, args.kv_get_user_arg, args.kv_put_callback, args.kv_put_user_arg)


def _create_options(address: int | None, count: int) -> dict[str, object]:
    """The integer and string create options by name (JAX passes node_id and num_nodes as int64)."""
    values: dict[str, object] = {}
    for entry in array_type(abi.PJRT_NamedValue, count).from_address(address) if count else ():
        name = ctypes.string_at(entry.name, entry.name_size).decode()
        if entry.type == abi.PJRT_NamedValue_kInt64:
            values[name] = entry.int64_value
        elif entry.type == abi.PJRT_NamedValue_kString:
            values[name] = ctypes.string_at(entry.string_value, entry.value_size).decode()
    return values


def exchange_devices(store: KeyValueStore, node: Node, summaries: list[dict]) -> list[list[dict]]:
    """The summaries of every node's devices (``Device.summary``: kind, target; ``summaries``
    this node's), through the store."""
    store.put(TOPOLOGY_KEY.format(node=node.index), json.dumps(summaries).encode())
    return [summaries if n == node.index else json.loads(store.get(TOPOLOGY_KEY.format(node=n)))
            for n in range(node.count)]
