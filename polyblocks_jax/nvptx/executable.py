"""A GPU executable: PTX modules and a launch plan, run without MLIR.

``GpuExecutable.serialize`` writes everything a run needs (PTX text per module, the plan,
the signature) as one JSON document, so executables built ahead of time on a build machine
run on a GPU machine where the compiler is not installed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np

from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.errors import InvalidProgramError
from polyblocks_jax.nvptx.plan import LaunchPlan
from polyblocks_jax.runtime.specs import check_arguments, spec_from_json, spec_to_json

_FORMAT = "polyblocks-gpu-executable/1"


@dataclasses.dataclass
class GpuExecutable:
    chip: str
    ptx: dict[str, str]   # gpu.module name -> PTX text
    plan: LaunchPlan
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    fingerprint: str = ""
    timings: dict[str, float] = dataclasses.field(default_factory=dict)

    # Nothing is donated: a call writes its outputs into fresh device memory.
    donated = overwritten = frozenset()
    replicas = partitions = 1  # a GPU program runs on one device

    @property
    def aliases(self) -> tuple[None, ...]:
        return (None,) * len(self.outputs)

    @property
    def arena_bytes(self) -> int:
        """Device memory of the temporaries, allocated on each call."""
        return sum(b.nbytes for b in self.plan.buffers if b.kind == "temp")

    @property
    def code_bytes(self) -> int:
        return sum(len(ptx) for ptx in self.ptx.values())

    def load(self) -> None:
        """Nothing to load before a device is chosen: the plugin loads the PTX on its device."""

    def __call__(self, *arrays) -> tuple[np.ndarray, ...]:
        """Run on the current CUDA device (cuda-python needed); returns numpy arrays."""
        from polyblocks_jax.nvptx import runtime  # the CUDA driver only when running
        return runtime.run(self, check_arguments(arrays, self.inputs))

    def serialize(self) -> bytes:
        return json.dumps({
            "format": _FORMAT, "chip": self.chip, "fingerprint": self.fingerprint, "ptx": self.ptx,
            "plan": json.loads(self.plan.to_json()),
            "inputs": [spec_to_json(s) for s in self.inputs], "outputs": [spec_to_json(s) for s in self.outputs],
            "sha256": _digest(self.ptx),
        }).encode()

    @classmethod
    def deserialize(cls, data: bytes) -> "GpuExecutable":
        try:
            doc = json.loads(data)
            if doc.get("format") != _FORMAT:
                raise InvalidProgramError(f"not a {_FORMAT} document")
            exe = cls(doc["chip"], dict(doc["ptx"]), LaunchPlan.from_json(json.dumps(doc["plan"])),
                      [spec_from_json(s) for s in doc["inputs"]], [spec_from_json(s) for s in doc["outputs"]],
                      doc["fingerprint"])
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidProgramError(f"corrupted polyblocks GPU executable: {e}") from None
        if _digest(exe.ptx) != doc["sha256"]:
            raise InvalidProgramError("corrupted polyblocks GPU executable: PTX checksum mismatch")
        return exe


def _digest(ptx: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(ptx, sort_keys=True).encode()).hexdigest()
