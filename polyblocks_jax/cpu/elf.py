"""The symbols relocatable ELF64 objects (what LLVM emits for the host) leave undefined, and
those a shared library defines."""
from __future__ import annotations

import struct
from typing import Iterable

_SHT_SYMTAB = 2
_SHT_DYNSYM = 11
_SHN_UNDEF = 0
_STB_LOCAL = 0


def undefined_symbols(objects: Iterable[bytes]) -> set[str]:
    """The symbols some of ``objects`` reference and none of them defines."""
    referenced: set[str] = set()
    defined: set[str] = set()
    for code in objects:
        for name, section, binding in _symbols(code):
            if section == _SHN_UNDEF:
                referenced.add(name)
            elif binding != _STB_LOCAL:
                defined.add(name)
    return referenced - defined


def defined_dynamic_symbols(library: bytes) -> frozenset[str]:
    """The symbols the shared library ``library`` (its bytes) defines for others, under any version."""
    return frozenset(name for name, section, binding in _symbols(library, _SHT_DYNSYM)
                     if section != _SHN_UNDEF and binding != _STB_LOCAL)


def _symbols(code: bytes, table: int = _SHT_SYMTAB) -> Iterable[tuple[str, int, int]]:
    """(name, section index, binding) of each named symbol of the symbol table of kind ``table``
    of an ELF64 little-endian file."""
    if code[:4] != b"\x7fELF" or code[4] != 2 or code[5] != 1:
        raise ValueError("not a little-endian ELF64 object")
    (section_headers,) = struct.unpack_from("<Q", code, 0x28)
    header_size, count = struct.unpack_from("<HH", code, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", code, section_headers + i * header_size) for i in range(count)]
    for _, kind, _, _, offset, size, link, _, _, entry_size in sections:
        if kind != table:
            continue
        strings = sections[link][4]
        for entry in range(offset + entry_size, offset + size, entry_size):  # entry 0 is null
            name, info, _, section = struct.unpack_from("<IBBH", code, entry)
            if name:
                end = code.index(b"\0", strings + name)
                yield code[strings + name:end].decode(), section, info >> 4
