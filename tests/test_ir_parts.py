"""LLVM IR cut into parts of about equal code (cpu/ir_parts.py): every part is a module LLVM
accepts, each function is defined in exactly one, and the parts' code differs by at most
the largest function; a variable is defined in one part; a module with an alias stays whole. Programs
compiled from parts match XLA in test_codegen.py."""
import re
import subprocess

from absl.testing import absltest

from polyblocks_jax.cpu import codegen, ir_parts


def _function(name: str, linkage: str, calls: list[str], size: int) -> str:
    body = [f"  call void @{callee}(ptr %p)" for callee in calls]
    body += [f"  store volatile i32 {i}, ptr %p" for i in range(size)]
    return "\n".join([f"define {linkage}void @{name}(ptr noalias %p) #0 {{", *body, "  ret void", "}"])


# main calls kernels of other sizes and linkages (an internal one, a weak one like our
# __truncsfbf2), which call each other; a private constant and metadata every part needs.
_MODULE = "\n".join([
    'target triple = "x86_64-unknown-linux-gnu"',
    "@ident = private unnamed_addr constant [4 x i8] c\"abc\\00\", align 1",
    _function("main", "", ["kernel", "kernel_1", "helper"], 4),
    _function("kernel", "internal ", ["helper"], 40),
    _function("kernel_1", "internal ", [], 30),
    _function("kernel_2", "internal ", ["kernel_1"], 25),
    _function("helper", "weak ", [], 10),
    "define internal ptr @uses_ident() {\n  ret ptr @ident\n}",
    "attributes #0 = { noinline }",
    "!llvm.module.flags = !{!0}",
    '!0 = !{i32 2, !"Debug Info Version", i32 3}',
    ""])


def _defined(module: str) -> list[str]:
    return re.findall(r"^define [^@]*@([\w.]+)\(", module, re.M)


def _verify(test: absltest.TestCase, module: str) -> None:
    done = subprocess.run([codegen._tool("opt"), "-passes=verify", "-disable-output", "-"],
                          input=module, capture_output=True, text=True)
    test.assertEqual(done.returncode, 0, done.stderr)


class BalancedPartsTest(absltest.TestCase):
    def test_each_function_is_defined_in_one_valid_part(self):
        for parts in (2, 3):
            modules = ir_parts.balanced_parts(_MODULE, parts)
            self.assertLen(modules, parts)
            defined = [name for module in modules for name in _defined(module)]
            self.assertCountEqual(defined, _defined(_MODULE))
            for module in modules:
                _verify(self, module)
                # a local definition is hidden: the other parts call it
                self.assertNotRegex(module, r"define (internal|private) ")

    def test_parts_differ_by_at_most_the_largest_function(self):
        modules = ir_parts.balanced_parts(_MODULE, 2)
        code = [sum(line.startswith("  ") for line in module.split("\n")) for module in modules]
        self.assertLessEqual(abs(code[0] - code[1]), 42)  # the largest: 40 stores, a call, ret

    def test_one_part_or_one_function_is_the_module_itself(self):
        self.assertEqual(ir_parts.balanced_parts(_MODULE, 1), [_MODULE])
        single = _function("main", "", [], 3) + "\n"
        self.assertEqual(ir_parts.balanced_parts(single, 4), [single])

    def test_a_variable_or_a_visible_global_is_defined_in_one_part(self):
        # the busy-machine threshold is such a variable (cpu/parallel_if.py): a module with
        # one stayed whole and compiled on one core
        for definition in ("@ident = internal global", "@ident = internal thread_local global",
                           "@ident = constant", "@ident = dso_local global", "@ident = global"):
            module = _MODULE.replace("@ident = private unnamed_addr constant", definition)
            modules = ir_parts.balanced_parts(module, 2)
            self.assertLen(modules, 2, definition)
            for part in modules:
                _verify(self, part)
            defining = [part for part in modules if re.search(r"^@ident = (?!external)", part, re.M)]
            self.assertLen(defining, 1, definition)
            self.assertNotRegex(defining[0], r"^@ident = (internal|private) ")

    def test_an_alias_keeps_the_module_whole(self):
        module = _MODULE.replace("attributes #0", "@other = alias void (ptr), ptr @helper\nattributes #0")
        _verify(self, module)
        self.assertEqual(ir_parts.balanced_parts(module, 2), [module])

    def test_a_declared_global_is_declared_in_every_part(self):
        # a large constant reaches the library as raw bytes: the IR declares it (constants.py)
        module = _MODULE.replace("@ident = private unnamed_addr constant [4 x i8] c\"abc\\00\", align 1",
                                 "@ident = external dso_local constant [4 x i8], align 64")
        self.assertIn("external dso_local constant", module)
        modules = ir_parts.balanced_parts(module, 2)
        self.assertLen(modules, 2)
        for part in modules:
            _verify(self, part)


if __name__ == "__main__":
    absltest.main()
