"""What ``POLYBLOCKS_DUMP=dir`` (``Options.dump_dir``) writes for each compile.

One folder per program, ``dir/<function>-<fingerprint>/`` (``jit_f-...`` for
``jax.jit(f)``): ``00-stablehlo.mlir`` as received, ``NN-<stage>.mlir`` after every stage
(``01-input.mlir``: the imported linalg), on the host ``llvm/`` with the LLVM IR as
translated, each part as optimized by opt and its assembly, and ``timings.txt`` with every
stage's time and those of opt, llc and the link. A Dump without a folder writes nothing.
"""
from __future__ import annotations

import os


class Dump:
    def __init__(self, directory: str | None, label: str) -> None:
        self.dir = os.path.join(directory, label) if directory else None
        self._count = 1  # 00: the StableHLO received
        if self.dir:
            os.makedirs(self.dir, exist_ok=True)

    def __bool__(self) -> bool:
        return self.dir is not None

    def path(self, name: str) -> str:
        """Where ``name`` goes (subfolders created)."""
        assert self.dir is not None
        path = os.path.join(self.dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return path

    def stablehlo(self, source: str | bytes) -> None:
        """The program as received (bytecode printed as text, with its locations)."""
        if self.dir:
            if isinstance(source, bytes):
                from polyblocks_jax.stablehlo_import import reader
                context = reader.new_context()
                source = reader.parse(source, context).operation.get_asm(enable_debug_info=True)
            self.text("00-stablehlo.mlir", source)

    def text(self, name: str, text: str) -> None:
        if self.dir:
            with open(self.path(name), "w") as f:
                f.write(text)

    def stage(self, stage: str, module) -> None:
        """The module after ``stage``, numbered in the order written."""
        if self.dir:  # printing a module costs as much as some stages: only for a folder
            self.text(f"{self._count:02d}-{stage}.mlir", str(module))
        self._count += 1

    def timings(self, timings: dict[str, float]) -> None:
        self.text("timings.txt", "".join(f"{name}\t{secs * 1e3:.2f} ms\n" for name, secs in timings.items()))
