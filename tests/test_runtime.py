"""The runtime without the compiler: serialized executables load and run where MLIR is absent.

A child process blocks every import of ``mlir`` (the compiler's MLIR), ``jaxlib`` (whose
MLIR reads StableHLO) and ``jax`` before importing polyblocks_jax, loads an executable this
process serialized, and runs it; the results are compared with XLA CPU here.
"""
from __future__ import annotations

import os
import tempfile
import textwrap

import jax
import numpy as np
from absl.testing import absltest

import polyblocks_jax as pb
import support

# Installed first in a child process: importing any of these raises ImportError.
BLOCK_IMPORTS = """
import sys

class BlockImports:
    def __init__(self, roots):
        self.roots = roots

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.roots:
            raise ImportError(f"{{name}} is blocked in this process")
        return None

sys.meta_path.insert(0, BlockImports({roots!r}))
"""


def blocking(roots: tuple[str, ...], code: str) -> str:
    """Python source that blocks imports of ``roots`` and then runs ``code``."""
    return BLOCK_IMPORTS.format(roots=roots) + textwrap.dedent(code)



def model(x, w, b):
    return (jax.nn.relu(x @ w + b).sum(axis=-1), jax.nn.softmax(w, axis=0))


class WithoutCompilerTest(absltest.TestCase):
    def test_serialized_executable_runs_without_mlir_jaxlib_or_jax(self):
        rng = np.random.default_rng(11)
        args = [rng.standard_normal(s).astype(np.float32) for s in ((8, 32), (32, 16), (16,))]
        lowered = jax.jit(model, donate_argnums=1).trace(*args).lower(lowering_platforms=("cpu",))
        exe = pb.compile(lowered, pb.Options())  # the default pipeline's aliasing, whatever the flags
        self.assertEqual(exe.aliases, (None, 1))  # the softmax of w is written into w's buffer
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "exe.bin"), "wb") as f:
                f.write(exe.serialize())
            np.savez(os.path.join(tmp, "args.npz"), *args)
            done = support.run_python(blocking(("mlir", "jaxlib", "jax"), f"""
                import os, numpy as np
                import polyblocks_jax as pb
                with open(os.path.join({tmp!r}, "exe.bin"), "rb") as f:
                    exe = pb.deserialize(f.read())
                loaded = np.load(os.path.join({tmp!r}, "args.npz"))
                args = [loaded[f"arr_{{i}}"] for i in range(3)]
                out = exe(*args)
                assert out[1] is args[1], "the donated argument does not hold its output"
                np.savez(os.path.join({tmp!r}, "out.npz"), *out)
                print(sorted(m for m in sys.modules if m.split(".")[0] in ("mlir", "jaxlib", "jax")))
            """))
            self.assertEqual(done.returncode, 0, done.stderr[-3000:])
            self.assertEqual(done.stdout.split("\n")[-2], "[]")
            with np.load(os.path.join(tmp, "out.npz")) as out:
                got = [out["arr_0"], out["arr_1"]]
        support.assert_close(self, got, support.xla_cpu(model, *args))

    def test_blocked_import_is_what_the_child_reports(self):
        done = support.run_python(blocking(("mlir",), "import mlir.ir"))
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("ImportError: mlir is blocked in this process", done.stderr)


if __name__ == "__main__":
    absltest.main()
