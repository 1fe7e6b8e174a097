"""A module's LLVM IR (text) cut into parts of about equal work, each a module of its own.

llvm-split places functions by a hash of their names: on ViT-Tiny one of six parts held
``main`` and three of the largest kernels, a third of the work, and the other core idled
while it was compiled. Here each function goes to the part with the least code so far,
largest first; its definition becomes hidden (a part calls what another defines) and every
other part declares it. What is not a function (types, constants, declarations, attribute
groups, metadata) is copied into every part; a module with a variable, or a global that every
part would define, stays whole.
"""
from __future__ import annotations

import re

_NAME = re.compile(r"@([-\w$.]+)\(")
_LOCAL = re.compile(r"^define (internal|private) ")
_LINKAGES = {"private", "internal", "available_externally", "linkonce", "weak", "common", "appending",
             "extern_weak", "linkonce_odr", "weak_odr", "external"}


def balanced_parts(text: str, parts: int) -> list[str]:
    """``text`` as at most ``parts`` modules that together define what it defines."""
    header, functions = _sections(text)
    globals_ = [line for line in header if line.startswith("@")]
    if parts <= 1 or len(functions) < 2 or not all(map(_copyable, globals_)):
        return [text]
    loads, members = [0] * parts, [[] for _ in range(parts)]
    for index in sorted(range(len(functions)), key=lambda i: len(functions[i]), reverse=True):
        lightest = loads.index(min(loads))
        loads[lightest] += len(functions[index])
        members[lightest].append(index)
    defines = [_LOCAL.sub("define hidden ", lines[0], count=1) for lines in functions]
    declarations = [_declaration(define) for define in defines]
    modules = []
    for chosen in filter(None, members):
        others = sorted(set(range(len(functions))) - set(chosen))
        lines = header + [declarations[i] for i in others]
        for i in chosen:
            lines += [defines[i], *functions[i][1:]]
        modules.append("\n".join(lines) + "\n")
    return modules


def _sections(text: str) -> tuple[list[str], list[list[str]]]:
    """The module's lines outside functions, and each function's lines (``define`` to ``}``)."""
    lines = text.split("\n")
    header, functions, i = [], [], 0
    while i < len(lines):
        if lines[i].startswith("define "):
            end = lines.index("}", i)
            functions.append(lines[i:end + 1])
            i = end + 1
        else:
            header.append(lines[i])
            i += 1
    return header, functions


def _copyable(global_: str) -> bool:
    """Whether every part may hold the line of this global: a declaration (external), or a
    local constant (our constants, OpenMP's idents). Each part's copy of a variable would be
    a variable of its own, and of a definition others can see, a symbol defined twice: such
    a module stays whole."""
    words = global_.split(" = ", 1)[-1].split()
    kind = next((i for i, word in enumerate(words) if word in ("global", "constant")), None)
    if kind is None:  # an alias or an ifunc
        return False
    qualifiers = set(words[:kind])
    return "external" in qualifiers or (words[kind] == "constant" and bool({"internal", "private"} & qualifiers))


def _declaration(define: str) -> str:
    """``declare`` for a ``define`` line: its signature up to the parameter list's close,
    without a linkage (a declaration takes none: a weak definition is declared plainly)."""
    name = _NAME.search(define)
    depth = 1
    for end in range(name.end(), len(define)):
        depth += {"(": 1, ")": -1}.get(define[end], 0)
        if depth == 0:
            prefix = [word for word in define[len("define "):name.start()].split() if word not in _LINKAGES]
            return " ".join(["declare", *prefix, define[name.start():end + 1]])
    raise ValueError(f"no parameter list in {define!r}")
