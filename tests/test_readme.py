"""The README stays true: each of its Python examples runs on its own, in a fresh process, and
computes what XLA computes; and the supported-ops section of docs/ops.md matches the converter table."""
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap

from absl.testing import absltest

from polyblocks_jax import op_table

README = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")
OPS = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "ops.md")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def _check_example(namespace: dict) -> None:
    """Appended to an example: its result `y` against its function `f` run by XLA CPU on the
    example's own arguments (those named as f's parameters), printed as JSON."""
    import jax
    import numpy as np
    args = [np.asarray(namespace[name]) for name in inspect.signature(namespace["f"]).parameters]
    cpu = jax.devices("cpu")[0]
    want = jax.jit(namespace["f"])(*[jax.device_put(a, cpu) for a in args])
    got = namespace["y"]
    got = got[0] if isinstance(got, tuple) else got
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    print(json.dumps({"checked": True}))


EPILOGUE = ("\nimport inspect, json\n" + textwrap.dedent(inspect.getsource(_check_example))
            + "_check_example(globals())\n")


class ReadmeTest(absltest.TestCase):
    def setUp(self):
        with open(README) as f:
            self.text = f.read()

    def test_supported_ops_section_is_current(self):
        with open(OPS) as f:
            text = f.read()
        self.assertEqual(op_table.replace_section(text), text,
                         "docs/ops.md is stale: run `python -m polyblocks_jax.op_table --write docs/ops.md`")

    def test_section_lists_a_known_op(self):
        self.assertIn("`stablehlo.add`", op_table.render())

    def test_examples_run_on_their_own(self):
        blocks = python_blocks(self.text)
        self.assertGreaterEqual(len(blocks), 2)
        env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "JAX_ENABLE_X64")}
        for i, block in enumerate(blocks):
            with self.subTest(example=i):
                self.assertIn("def f(", block)
                run = subprocess.run([sys.executable, "-c", block + EPILOGUE], capture_output=True,
                                     text=True, env=env, timeout=300)
                self.assertEqual(run.returncode, 0, f"README example {i} failed:\n{block}\n{run.stderr[-3000:]}")
                self.assertEqual(json.loads(run.stdout.strip().splitlines()[-1]), {"checked": True})


if __name__ == "__main__":
    absltest.main()
