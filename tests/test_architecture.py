"""The package's layering, read from its source (ast; nothing is imported or run).

``passes/`` serves every target: it imports no target folder and names no target dialect.
The run side (the plugin, the runtime, the target registry, each target's object, executable
and hardware description) imports no MLIR when its modules load: MLIR is the compiler's,
loaded at the first compile. The plugin chooses no target: a device names its own, and
nothing in ``pjrt/`` compares a target's name or asks whether a device is a GPU.
"""
from __future__ import annotations

import ast
import importlib
import pathlib
import re

from absl.testing import absltest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "polyblocks_jax"
TARGET_FOLDERS = ("cpu", "nvptx")
# Dialects of one target: the host's vector and matrix extensions, OpenMP, NVIDIA's GPU ops.
TARGET_DIALECTS = ("x86vector", "amx", "omp", "gpu", "nvvm", "nvgpu")
_TARGET_OP = re.compile(r"\b(" + "|".join(TARGET_DIALECTS) + r")\.[a-z_]")
# What loads without the compiler: these packages with all their modules, and these modules.
RUN_SIDE_PACKAGES = ("polyblocks_jax.pjrt", "polyblocks_jax.runtime")
RUN_SIDE_MODULES = ("polyblocks_jax", "polyblocks_jax.targets",
                    "polyblocks_jax.cpu", "polyblocks_jax.cpu.backend", "polyblocks_jax.cpu.executable",
                    "polyblocks_jax.cpu.target",
                    "polyblocks_jax.nvptx", "polyblocks_jax.nvptx.backend", "polyblocks_jax.nvptx.executable",
                    "polyblocks_jax.nvptx.plan", "polyblocks_jax.nvptx.runtime", "polyblocks_jax.nvptx.target")
# What a branch on the target would compare: a registry name, a target folder's name, a chip.
_TARGET_NAME = re.compile(r"^(cpu|host|gpu|nvptx.*|sm_\d+a?)$")


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imported(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    """The modules (and the names taken from them, as ``module.name``) an import names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's package up
        package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _imports(module: str, top_level_only: bool) -> list[str]:
    """What ``module`` imports: everywhere, or only where it loads (not in functions)."""
    tree = ast.parse(MODULES[module].read_text())
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.extend(_imported(node, module))
        elif top_level_only and _for_annotations(node):
            return
        elif not (top_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))):
            for child in ast.iter_child_nodes(node):
                visit(child)

    visit(tree)
    return found


def _for_annotations(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:``: imports for annotations, which never run."""
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _is_mlir(name: str) -> bool:
    return name == "mlir" or name.startswith(("mlir.", "jaxlib.mlir"))


def _loads_mlir(module: str) -> list[str]:
    """The chains of modules through which loading ``module`` loads MLIR (empty: none)."""
    chains, seen, stack = [], set(), [(module,)]
    while stack:
        chain = stack.pop()
        if chain[-1] in seen:
            continue
        seen.add(chain[-1])
        parents = chain[-1].split(".")
        loaded = [".".join(parents[:i]) for i in range(1, len(parents))] + _imports(chain[-1], top_level_only=True)
        for name in loaded:
            if _is_mlir(name):
                chains.append(" -> ".join((*chain, name)))
            elif name in MODULES:
                stack.append((*chain, name))
    return chains


class SharedPassesTest(absltest.TestCase):
    def test_passes_import_no_target_folder(self):
        forbidden = tuple(f"polyblocks_jax.{t}" for t in TARGET_FOLDERS) + \
            tuple(f"mlir.dialects.{d}" for d in TARGET_DIALECTS)
        for module in (m for m in MODULES if m.startswith("polyblocks_jax.passes")):
            for name in _imports(module, top_level_only=False):
                self.assertFalse(name.startswith(forbidden), f"{module} imports {name}")

    def test_passes_name_no_target_dialect(self):
        for module in (m for m in MODULES if m.startswith("polyblocks_jax.passes")):
            for node in ast.walk(ast.parse(MODULES[module].read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    self.assertIsNone(_TARGET_OP.search(node.value), f"{module} names {node.value[:80]!r}")

    def test_the_checks_see_a_target_import_and_a_target_op(self):
        self.assertIn("polyblocks_jax.cpu.vectorize.vectorize_ops", _imports("polyblocks_jax.cpu.stages", False))
        self.assertIsNotNone(_TARGET_OP.search('ir.Operation.create("x86vector.avx512.mask.scalef")'))


class RunSideTest(absltest.TestCase):
    def test_run_side_loads_no_mlir(self):
        run_side = [m for m in MODULES if m in RUN_SIDE_MODULES or m.startswith(RUN_SIDE_PACKAGES)]
        self.assertGreater(len(run_side), 20)
        for module in run_side:
            self.assertEqual(_loads_mlir(module), [], module)

    def test_the_check_sees_mlir_loaded_through_an_import(self):
        self.assertTrue(_loads_mlir("polyblocks_jax.cpu.stages"))
        self.assertIn("polyblocks_jax.passes.work", _imports("polyblocks_jax.targets", top_level_only=False))
        self.assertNotIn("polyblocks_jax.passes.work", _imports("polyblocks_jax.targets", top_level_only=True))

    def test_each_target_and_its_executables_are_run_side(self):
        from polyblocks_jax import targets
        from polyblocks_jax.nvptx import GpuExecutable
        from polyblocks_jax.runtime.executable import Executable
        for provider in targets.PROVIDERS:
            self.assertIn(provider, RUN_SIDE_MODULES)
            for target in importlib.import_module(provider).PROVIDED:
                self.assertIn(type(target).__module__, RUN_SIDE_MODULES, target.name)
        for executable in (Executable, GpuExecutable):
            self.assertTrue(executable.__module__ in RUN_SIDE_MODULES or
                            executable.__module__.startswith(RUN_SIDE_PACKAGES), executable)


def _target_branches(source: str, where: str) -> list[str]:
    """The tests in ``source`` of which target a program is for, or whether a device is a GPU."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.BoolOp):
            operands = node.values
        elif isinstance(node, (ast.If, ast.IfExp, ast.While)):
            operands = [node.test]
        else:
            continue
        for operand in operands:
            if isinstance(operand, ast.UnaryOp):
                operand = operand.operand
            named = any(isinstance(c, ast.Constant) and isinstance(c.value, str) and _TARGET_NAME.match(c.value)
                        for c in ast.walk(operand))
            if named or (isinstance(operand, ast.Attribute) and operand.attr == "gpu"):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


class PluginTest(absltest.TestCase):
    def test_the_plugin_has_no_per_target_branch(self):
        plugin = [m for m in MODULES if m.startswith("polyblocks_jax.pjrt")]
        self.assertGreater(len(plugin), 20)
        for module in plugin:
            self.assertEqual(_target_branches(MODULES[module].read_text(), module), [])

    def test_the_check_sees_a_branch_on_a_target(self):
        for source in ('if executable.target == "cpu": pass', "x = a if device.gpu is None else b",
                       "if not device.gpu: pass", 'ok = chip in ("sm_90a",) and ready'):
            with self.subTest(source=source):
                self.assertTrue(_target_branches(source, "probe"))


if __name__ == "__main__":
    absltest.main()
