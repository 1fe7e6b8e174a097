"""The README's supported-ops section is generated from the converter table and must match it."""
import os

from absl.testing import absltest

from polyblocks_jax import op_table

README = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")


class ReadmeTest(absltest.TestCase):
    def test_supported_ops_section_is_current(self):
        with open(README) as f:
            text = f.read()
        self.assertEqual(op_table.replace_section(text), text,
                         "README is stale: run `python -m polyblocks_jax.op_table --write README.md`")

    def test_section_lists_a_known_op(self):
        self.assertIn("`stablehlo.add`", op_table.render())


if __name__ == "__main__":
    absltest.main()
