"""The DeviceAssignmentProto: which devices a program is compiled for and runs on, one per
replica and partition.

jaxlib hands it over serialized (in the compile options) and asks for it back
(LoadedExecutable_GetDeviceAssignment); these few fields are read and written by hand.
"""
from __future__ import annotations

from polyblocks_jax.pjrt.errors import invalid


def encode_grid(grid: list[list[int]]) -> bytes:
    """The DeviceAssignmentProto of ``grid[replica][partition]`` (device ids); partitions are
    XLA's computations, each listing its device per replica."""
    replicas, partitions = len(grid), len(grid[0])
    out = b"\x08" + _varint(replicas) + b"\x10" + _varint(partitions)
    for p in range(partitions):
        ids = b"".join(_varint(grid[r][p]) for r in range(replicas))
        devices = b"\x0a" + _varint(len(ids)) + ids
        out += b"\x1a" + _varint(len(devices)) + devices
    return out


def decode_grid(proto: bytes) -> list[list[int]]:
    """``grid[replica][partition]``: the device ids of a DeviceAssignmentProto (``encode_grid``'s inverse)."""
    columns = []
    for field, value in _fields(proto):
        if field == 3:  # computation_devices: one per partition
            ids = []
            for inner, packed in _fields(value):
                if inner == 1:  # replica_device_ids: packed (bytes) or one varint
                    ids.extend(_varints(packed) if isinstance(packed, bytes) else [packed])
            columns.append(ids)
    if not columns or not columns[0] or any(len(c) != len(columns[0]) for c in columns):
        raise invalid("device assignment without a device for every replica and partition")
    return [[column[r] for column in columns] for r in range(len(columns[0]))]


def _varints(data: bytes) -> list[int]:
    values, i = [], 0
    while i < len(data):
        value, i = _read_varint(data, i)
        values.append(value)
    return values


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _fields(data: bytes):
    """(field number, value) of a protobuf message holding varints and length-delimited fields."""
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        if key & 7 == 0:
            value, i = _read_varint(data, i)
        elif key & 7 == 2:
            size, i = _read_varint(data, i)
            value, i = data[i:i + size], i + size
        else:
            raise invalid(f"unexpected protobuf wire type {key & 7} in a device assignment")
        yield key >> 3, value


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[i]
        value, shift, i = value | (byte & 0x7F) << shift, shift + 7, i + 1
        if byte < 0x80:
            return value, i
