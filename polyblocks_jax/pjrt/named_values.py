"""PJRT_NamedValue arrays built from a Python dict; the array owns every string it points at."""
from __future__ import annotations

import ctypes

from pypjrt._abi import pjrt_0_114 as abi

from polyblocks_jax.runtime.foreign_memory import array_type


class NamedValues:
    """An immutable PJRT_NamedValue[] kept alive with its strings and int lists."""

    def __init__(self, values: dict[str, str | int | float | bool | list[int]]) -> None:
        self._keep: list[object] = []
        self.array = (abi.PJRT_NamedValue * max(len(values), 1))()
        self.count = len(values)
        for entry, (name, value) in zip(self.array, values.items()):
            self._fill(entry, name, value)

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)

    def _fill(self, entry: abi.PJRT_NamedValue, name: str, value) -> None:
        entry.struct_size = abi.PJRT_NamedValue_STRUCT_SIZE
        encoded = self._string(name)
        entry.name, entry.name_size = encoded
        if isinstance(value, bool):
            entry.type, entry.bool_value, entry.value_size = abi.PJRT_NamedValue_kBool, value, 1
        elif isinstance(value, int):
            entry.type, entry.int64_value, entry.value_size = abi.PJRT_NamedValue_kInt64, value, 1
        elif isinstance(value, float):
            entry.type, entry.float_value, entry.value_size = abi.PJRT_NamedValue_kFloat, value, 1
        elif isinstance(value, str):
            entry.type = abi.PJRT_NamedValue_kString
            entry.string_value, entry.value_size = self._string(value)
        else:
            ints = array_type(ctypes.c_int64, max(len(value), 1))(*value)
            self._keep.append(ints)
            entry.type = abi.PJRT_NamedValue_kInt64List
            entry.int64_array_value, entry.value_size = ctypes.addressof(ints), len(value)

    def _string(self, text: str) -> tuple[int, int]:
        data = text.encode()
        buffer = ctypes.create_string_buffer(data)
        self._keep.append(buffer)
        return ctypes.addressof(buffer), len(data)
