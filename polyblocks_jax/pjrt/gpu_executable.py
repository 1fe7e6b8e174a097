"""Programs for a GPU device: compiled to PTX by ``nvptx.compile``, run by ``nvptx.runtime``.

The target is the device's compute capability: sm_90 gets sm_90a (Hopper's warpgroup
instructions), other chips the newest target not above them (plain PTX runs on later
chips). A call enqueues the plan's launches on the device's stream over the argument
buffers' device memory, with fresh device memory for the outputs and temporaries (freed
stream-ordered after the launches); the outputs' ready event is one CUDA event recorded
after the last launch. Nothing is donated: donated arguments stay valid, as XLA leaves
buffers it cannot reuse.
"""
from __future__ import annotations

from polyblocks_jax.options import Options
from polyblocks_jax.pjrt.errors import invalid
from polyblocks_jax.pjrt.events import CudaEvent
from polyblocks_jax.pjrt.executable import Executable, LoadedExecutable
from polyblocks_jax.pjrt.gpu_buffer import GpuBuffer

TARGET = "nvptx"  # the serialized header's name for these programs


class GpuProgram:
    """A ``GpuExecutable`` as ``pjrt.executable.Executable`` reads a compiled program."""
    donated = overwritten = frozenset()
    replicas = partitions = 1  # a GPU program runs on one device

    def __init__(self, exe) -> None:
        self.exe = exe
        self.inputs, self.outputs, self.fingerprint = exe.inputs, exe.outputs, exe.fingerprint
        self.aliases = [None] * len(exe.outputs)

    @property
    def arena_bytes(self) -> int:
        """Device memory of the temporaries, allocated on each call."""
        return sum(b.nbytes for b in self.exe.plan.buffers if b.kind == "temp")

    @property
    def code_bytes(self) -> int:
        return sum(len(ptx) for ptx in self.exe.ptx.values())

    def serialize(self) -> bytes:
        return self.exe.serialize()


def chip_for(capability: str) -> str:
    """The PTX target for a device of compute capability ``capability`` ("sm_90")."""
    from polyblocks_jax.nvptx import SM90, SM90A, TARGETS
    if capability == SM90.chip:
        return SM90A.chip
    number = int(capability.removeprefix("sm_"))
    known = [t for t in TARGETS if not t.endswith("a") and int(t.removeprefix("sm_")) <= number]
    if not known:
        raise invalid(f"no PTX target for a {capability} GPU (oldest: {min(TARGETS)})")
    return max(known, key=lambda t: int(t.removeprefix("sm_")))


def compile_for(code: bytes, compile_options: bytes, device, options: Options) -> "GpuLoadedExecutable":
    from polyblocks_jax.nvptx import compile_gpu
    exe = compile_gpu(code, chip_for(device.gpu.chip), options)
    return GpuLoadedExecutable(Executable(GpuProgram(exe), "main", compile_options, code, TARGET), device)


def deserialize_program(data: bytes) -> GpuProgram:
    from polyblocks_jax.nvptx import GpuExecutable
    return GpuProgram(GpuExecutable.deserialize(data))


class GpuLoadedExecutable(LoadedExecutable):
    def __init__(self, executable: Executable, device) -> None:
        from polyblocks_jax.nvptx import runtime
        chip, wanted = executable.compiled.exe.chip, chip_for(device.gpu.chip)
        if chip != wanted:
            raise invalid(f"executable compiled for {chip} cannot run on a {device.gpu.chip} GPU (needs {wanted})")
        super().__init__(executable, device)
        self.loaded = runtime.load(executable.compiled.exe, device.gpu)

    def completion(self, outputs: list[GpuBuffer]) -> CudaEvent:
        """The outputs' ready event: one CUDA event after the call's launches."""
        return outputs[0].ready if outputs else CudaEvent(self.device.gpu)

    def execute(self, buffers: list, non_donatable: frozenset[int]) -> list[GpuBuffer]:
        exe, device, gpu = self.executable, self.device, self.device.gpu
        self.check_arguments(buffers)
        results = [GpuBuffer(shape, dtype, device) for shape, dtype in exe.out_shapes]
        pointers, temps = [], []
        for b in self.loaded.exe.plan.buffers:
            if b.kind == "input":
                pointers.append(buffers[b.index].pointer())
            elif b.kind == "output":
                pointers.append(results[b.index].pointer())
            else:
                temps.append(gpu.alloc(b.nbytes))
                pointers.append(temps[-1])
        self.loaded.launch(pointers)
        for pointer in temps:
            gpu.free(pointer)
        done = CudaEvent(gpu)
        for r in results:
            r.ready = done
        for k in exe.token_outputs:
            results[k].token = True
        return results
