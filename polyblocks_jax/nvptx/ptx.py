"""The CUDA toolkit pieces the compiler uses, found without a GPU: ptxas and libdevice.

Looked up in order: ``$POLYBLOCKS_CUDA_ROOT``, ``ptxas`` on ``PATH`` (its real location,
through wrapper scripts), ``/usr/local/cuda``, and the pip wheels ``nvidia-cuda-nvcc``
(ptxas) and ``nvidia-nvvm`` / ``nvidia-cuda-nvcc`` (libdevice). ``assemble`` runs ptxas on
PTX text: it validates what gpu-module-to-binary emitted, and its error carries ptxas's
message and the command that reproduces it; ``usage`` also reads ptxas's resource report
(registers, spills, shared memory per kernel).
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import Sequence

from polyblocks_jax.errors import CompilationError

ROOT_ENV = "POLYBLOCKS_CUDA_ROOT"
_LIBDEVICE = os.path.join("nvvm", "libdevice", "libdevice.10.bc")


class PtxasError(CompilationError):
    """ptxas rejected PTX: ``command`` reruns it on the kept file ``ptx_path``."""

    def __init__(self, message: str, command: list[str], ptx_path: str) -> None:
        self.command, self.ptx_path = command, ptx_path
        super().__init__("ptxas", f"{message}\nreproduce: {shlex.join(command)}")


def _candidate_roots() -> list[str]:
    roots = [os.environ.get(ROOT_ENV, "")]
    on_path = shutil.which("ptxas")
    if on_path:
        roots.append(os.path.dirname(os.path.dirname(on_path)))
        roots.append(os.path.dirname(os.path.dirname(_wrapped_target(on_path))))
    roots.append("/usr/local/cuda")
    for site in sys.path:  # pip wheels: nvidia/cuda_nvcc (12.x), nvidia/cu13 and nvidia/nvvm (13.x)
        roots += glob.glob(os.path.join(site, "nvidia", "cuda_nvcc")) + glob.glob(os.path.join(site, "nvidia", "cu1*"))
        roots += [os.path.dirname(p) for p in glob.glob(os.path.join(site, "nvidia", "nvvm"))]
    return [r for r in roots if r and os.path.isdir(r)]


def _wrapped_target(path: str) -> str:
    """The binary a small ``exec /real/ptxas "$@"`` wrapper script runs, else ``path`` itself."""
    real = os.path.realpath(path)
    try:
        with open(real, "rb") as f:
            head = f.read(512)
    except OSError:
        return real
    if head.startswith(b"#!"):
        for word in head.decode(errors="replace").split():
            if word.endswith("/ptxas") and os.path.isfile(word):
                return word
    return real


@functools.cache
def find_ptxas() -> str | None:
    on_path = shutil.which("ptxas")
    if on_path:
        return on_path
    for root in _candidate_roots():
        path = os.path.join(root, "bin", "ptxas")
        if os.access(path, os.X_OK):
            return path
    return None


@functools.cache
def find_toolkit() -> str | None:
    """A directory holding ``nvvm/libdevice/libdevice.10.bc`` (gpu-module-to-binary's ``toolkit``)."""
    for root in _candidate_roots():
        if os.path.isfile(os.path.join(root, _LIBDEVICE)):
            return root
    return None


@dataclasses.dataclass(frozen=True)
class KernelUsage:
    """What ptxas reports of one kernel: registers a thread, spilled bytes, static shared memory."""
    registers: int
    spill_bytes: int
    shared_bytes: int


def assemble(ptx: str, chip: str, ptxas: str | None = None) -> bytes:
    """Assemble ``ptx`` for ``chip`` with ptxas; returns the cubin, raises PtxasError with the reason."""
    return _run_ptxas(ptx, chip, ptxas)[0]


def usage(ptx: str, chip: str, ptxas: str | None = None) -> dict[str, KernelUsage]:
    """Assemble ``ptx`` and return ptxas's resource report (``-v``) per kernel entry."""
    report = _run_ptxas(ptx, chip, ptxas, ["-v"])[1]
    kernels: dict[str, KernelUsage] = {}
    for name, body in re.findall(r"Compiling entry function '(\w+)'(.*?)(?=Compiling entry|\Z)", report, re.S):
        number = lambda pattern: sum(int(n) for n in re.findall(pattern, body))  # noqa: E731
        kernels[name] = KernelUsage(number(r"Used (\d+) registers"), number(r"(\d+) bytes spill stores"),
                                    number(r"(\d+) bytes smem"))
    return kernels


def _run_ptxas(ptx: str, chip: str, ptxas: str | None, flags: Sequence[str] = ()) -> tuple[bytes, str]:
    """(cubin, ptxas's report); raises PtxasError, keeping the PTX file, when ptxas rejects it."""
    ptxas = ptxas or find_ptxas()
    if ptxas is None:
        raise CompilationError("ptxas", f"ptxas not found: put it on PATH or set {ROOT_ENV}")
    tmp = tempfile.mkdtemp(prefix="polyblocks-ptx-")
    source, cubin = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
    with open(source, "w") as f:
        f.write(ptx)
    command = [ptxas, f"-arch={chip}", "-O3", *flags, source, "-o", cubin]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:  # keep the file so that the command can be rerun
        raise PtxasError((done.stderr or done.stdout).strip(), command, source)
    with open(cubin, "rb") as f:
        data = f.read()
    shutil.rmtree(tmp, ignore_errors=True)
    return data, done.stdout + done.stderr
