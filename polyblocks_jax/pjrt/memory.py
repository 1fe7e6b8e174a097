"""Device memories: one per device, each of kind "device", which JAX's sharding code looks for
on every device."""
from __future__ import annotations

from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.c_values import HandleArray, Text

MEMORY_KIND = "device"
MEMORY_KIND_ID = 0


class Memory:
    def __init__(self, memory_id: int, where: str) -> None:
        self.where = where
        self.kind = Text(MEMORY_KIND)
        self.kind_id = MEMORY_KIND_ID
        self.number(memory_id)
        self.device = None  # the device this memory belongs to
        self.devices = HandleArray([])
        self.handle = handles.register(self, handles.MEMORY, self.kind.address, self.kind.size)

    def number(self, memory_id: int) -> None:
        self.id = memory_id
        self.debug_string = Text(f"polyblocks {self.where} memory {memory_id}")
        self.to_string = Text(f"PolyblocksMemory(id={memory_id}, kind={MEMORY_KIND})")
