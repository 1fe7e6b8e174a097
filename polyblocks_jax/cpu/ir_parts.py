"""A module's LLVM IR (text) cut into parts of about equal work, each a module of its own.

llvm-split places functions by a hash of their names: on ViT-Tiny one of six parts held
``main`` and three of the largest kernels, a third of the work, and the other core idled
while it was compiled. Here each function goes to the part with the least code so far,
largest first; its definition becomes hidden (a part calls what another defines) and every
other part declares it. What is not a function (types, constants, declarations, attribute
groups, metadata) is copied into every part, but a variable, or a constant other objects
may see, is defined in the first part (hidden where it was local) and declared in the
others: two definitions would be two variables, or one symbol defined twice. A module with
an alias or an ifunc stays whole.
"""
from __future__ import annotations

import re

_NAME = re.compile(r"@([-\w$.]+)\(")
_LOCAL = re.compile(r"^define (internal|private) ")
_GLOBAL_LOCAL = re.compile(r"^(@[-\w$.]+ = )(internal|private) ")
_LINKAGES = {"private", "internal", "available_externally", "linkonce", "weak", "common", "appending",
             "extern_weak", "linkonce_odr", "weak_odr", "external"}


def balanced_parts(text: str, parts: int) -> list[str]:
    """``text`` as at most ``parts`` modules that together define what it defines."""
    header, functions = _sections(text)
    # header lines as the first part holds them (each variable defined) and as the others do
    defining = [_GLOBAL_LOCAL.sub(r"\1hidden ", line, count=1) if _owned(line) else line for line in header]
    declaring = [_global_declaration(line) if _owned(line) else line for line in header]
    if parts <= 1 or len(functions) < 2 or None in declaring:
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
        lines = (declaring if modules else defining) + [declarations[i] for i in others]
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


def _owned(line: str) -> bool:
    """Whether this header line is a global only one part may define: not a declaration
    (external) nor a local constant (our constants, OpenMP's idents), which every part holds."""
    if not line.startswith("@"):
        return False
    words = line.split(" = ", 1)[-1].split()
    kind = next((i for i, word in enumerate(words) if word in ("global", "constant")), None)
    if kind is None:  # an alias or an ifunc: _global_declaration keeps the module whole
        return True
    qualifiers = set(words[:kind])
    return not ("external" in qualifiers or (words[kind] == "constant" and bool({"internal", "private"} & qualifiers)))


def _global_declaration(global_: str) -> str | None:
    """``@name = external global TYPE`` for a global's definition line (thread-local and
    address-space qualifiers kept); None for an alias, an ifunc or a type not read here."""
    name, _, rest = global_.partition(" = ")
    match = re.match(r"((?:[\w()]+ )*?)(global|constant) ", rest)
    if match is None:
        return None
    kept = [word for word in match.group(1).split() if word.startswith(("thread_local", "addrspace"))]
    type_ = _leading_type(rest[match.end():])
    return None if type_ is None else " ".join([name, "=", "external", *kept, match.group(2), type_])


def _leading_type(text: str) -> str | None:
    """The LLVM type ``text`` starts with: one word, or a bracketed array, vector or struct."""
    closing = {"[": "]", "{": "}", "<": ">"}
    if not text or text[0] not in closing:
        word = text.split(" ", 1)[0].rstrip(",")
        return word or None
    depth = 0
    for end, char in enumerate(text):
        depth += (char in closing) - (char in closing.values())
        if depth == 0:
            return text[:end + 1]
    return None


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
