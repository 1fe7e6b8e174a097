"""The 1 x 1 DeviceAssignmentProto: which one device a program is compiled for and runs on.

jaxlib hands it over serialized (in the compile options) and asks for it back
(LoadedExecutable_GetDeviceAssignment); these few fields are read and written by hand.
"""
from __future__ import annotations

from polyblocks_jax.pjrt.errors import invalid


def encode(device_id: int) -> bytes:
    """DeviceAssignmentProto{replica_count: 1, computation_count: 1, computation_devices: [{replica_device_ids: [id]}]}."""
    ids = _varint(device_id)
    devices = b"\x0a" + _varint(len(ids)) + ids
    return b"\x08\x01\x10\x01\x1a" + _varint(len(devices)) + devices


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def device_id(proto: bytes) -> int:
    """The device id in a 1 x 1 DeviceAssignmentProto (the inverse of ``encode``)."""
    for field, value in _fields(proto):
        if field == 3:  # computation_devices
            for inner, ids in _fields(value):
                if inner == 1:  # replica_device_ids: packed (bytes) or one varint
                    return _read_varint(ids, 0)[0] if isinstance(ids, bytes) else ids
    raise invalid("device assignment without a device")


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
