"""A compile worker's process: ``python -m polyblocks_jax.compile_workers.worker REQUESTS REPLIES STAGE KIND``.

Reads jobs from the pipe ``REQUESTS`` and answers on ``REPLIES``, writing the stage under
way in the slot ``STAGE`` (file descriptors its parent passed; see ``protocol``) until its
parent closes the requests. It imports the compiler, not jax: it compiles what it is handed,
with the options it is handed. A "host" worker runs the host's LLVM in its own process
(``cpu.codegen.load_llvm``, with our options); a "plain" one leaves LLVM's options alone.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys

from polyblocks_jax import native_build
from polyblocks_jax.compile_workers import protocol
from polyblocks_jax.options import Options


def main(requests_fd: int, replies_fd: int, stage_fd: int, kind: str) -> None:
    _exit_with_parent(requests_fd)
    requests, replies = protocol.reader(requests_fd), protocol.writer(replies_fd)
    stage = protocol.StageSlot(stage_fd)
    os.close(stage_fd)  # mapped
    from polyblocks_jax import contexts, in_process
    from polyblocks_jax.cpu import codegen, host
    from polyblocks_jax.passes import pipeline
    if kind == "host":
        codegen.load_llvm()  # a crash of LLVM here ends this process, not the user's
    contexts.keep_per_thread()
    pipeline.defer_verification()  # as LLVM's, a crash of MLIR on invalid IR ends this process only
    if kind == "host":
        _warm_up(in_process)
    replies.send((protocol.READY, host().description()))
    while True:
        try:
            job = requests.recv()
        except EOFError:  # the parent closed the pipe, or exited
            return
        replies.send(_compile(in_process, job, stage.write))


def _exit_with_parent(requests_fd: int) -> None:
    """End this process when its parent closes the job pipe or ends, mid-compile too
    (parent_watch.c); where the watcher cannot be built, the worker ends between jobs."""
    try:
        library = ctypes.CDLL(native_build.shared_library(
            os.path.join(os.path.dirname(__file__), "parent_watch.c"), "parent_watch", ["-lpthread"]))
    except (OSError, subprocess.SubprocessError):
        return
    library.pb_exit_with_parent(ctypes.c_int(requests_fd))


# A matmul, an elementwise op and a reduction: what most programs' first compile meets.
_WARM_UP = """
func.func public @main(%a: tensor<16x16xf32>) -> tensor<16xf32> {
  %0 = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0] : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %1 = stablehlo.tanh %0 : tensor<16x16xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %2 = stablehlo.reduce(%1 init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<16x16xf32>, tensor<f32>) -> tensor<16xf32>
  return %2 : tensor<16xf32>
}
"""


def _warm_up(in_process) -> None:
    """Compile a small program before the first job: a first compile also pays for modules
    imported on first use and LLVM's first code generation (0.4 s against 0.2 after this)."""
    try:
        in_process.compile_in_process(_WARM_UP, Options(object_cache=False), "warm-up", {}, None)
    except Exception:  # noqa: BLE001 (only an optimization: the jobs report their own errors)
        pass


def _compile(in_process, job: protocol.Job, on_stage) -> tuple:
    try:
        exe = in_process.compile_in_process(job.source, job.options, job.key, job.marks, job.donate_argnums,
                                            on_stage, job.target)
        return protocol.DONE, exe.serialize(), exe.timings
    except Exception as e:  # noqa: BLE001 (every error goes back to the caller, as raised)
        return protocol.ERROR, protocol.encode_error(e)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
