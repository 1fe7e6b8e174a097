"""A compile worker's process: ``python -m polyblocks_jax.compile_workers.worker REQUESTS REPLIES STAGE``.

Reads jobs from the pipe ``REQUESTS`` and answers on ``REPLIES``, writing the stage under
way in the slot ``STAGE`` (file descriptors its parent passed; see ``protocol``) until its
parent closes the requests. It imports the
compiler, not jax: it compiles what it is handed, with the options it is handed, and runs
LLVM in its own process (``cpu.codegen.load_llvm``).
"""
from __future__ import annotations

import os
import sys

from polyblocks_jax.compile_workers import protocol


def main(requests_fd: int, replies_fd: int, stage_fd: int) -> None:
    requests, replies = protocol.reader(requests_fd), protocol.writer(replies_fd)
    stage = protocol.StageSlot(stage_fd)
    os.close(stage_fd)  # mapped
    from polyblocks_jax import contexts, in_process
    from polyblocks_jax.cpu import codegen, host
    codegen.load_llvm()  # a crash of LLVM here ends this process, not the user's
    contexts.keep_per_thread()
    replies.send((protocol.READY, host().description()))
    while True:
        try:
            job = requests.recv()
        except EOFError:  # the parent closed the pipe, or exited
            return
        replies.send(_compile(in_process, job, stage.write))


def _compile(in_process, job: protocol.Job, on_stage) -> tuple:
    try:
        exe = in_process.compile_in_process(job.source, job.options, job.key, job.marks, job.donate_argnums,
                                            on_stage, job.target)
        return protocol.DONE, exe.serialize(), exe.timings
    except Exception as e:  # noqa: BLE001 (every error goes back to the caller, as raised)
        return protocol.ERROR, protocol.encode_error(e)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
