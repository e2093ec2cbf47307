"""Where shared libraries come from: the dynamic loader's cache, a process's maps, a dlopen handle."""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from sm120check import bounded
from sm120check.doctor import child

# Library families the ABI checks follow: name stem -> what it is.
TRACKED = ("libnvrtc", "libcudart", "libnccl", "libcuda")
MAPS_BYTES = 64 << 20  # /proc/self/maps of a process with torch loaded is about 1 MiB

_LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$")


def stem(filename: str) -> str:
    """libnvrtc.so.13 -> libnvrtc; libnvrtc-builtins.so.13.0 -> libnvrtc-builtins; libcuda.so.1 -> libcuda."""
    return Path(filename).name.split(".so", 1)[0]


def parse_ldconfig(text: str) -> dict[str, list[str]]:
    """`ldconfig -p` output -> soname -> paths in cache order (x86-64 entries and any others alike)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = _LDCONFIG_LINE.match(line)
        if match:
            found.setdefault(match.group(1), []).append(match.group(3))
    return found


def ldconfig_cache() -> dict[str, list[str]]:
    for binary in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        done = child.run_command([binary, "-p"], timeout=10)  # own process group, killed when the doctor stops
        if done.returncode in (124, 127, 130) and not done.stdout:
            continue
        return parse_ldconfig(done.stdout)
    return {}


def parse_maps(text: str, stems: Iterable[str] = TRACKED) -> dict[str, list[str]]:
    """/proc/<pid>/maps text -> library stem -> distinct mapped file paths (in order of first mapping)."""
    wanted = set(stems)
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        path = fields[5].strip()
        if ".so" not in path:
            continue
        name = stem(path)
        if name in wanted and path not in found.setdefault(name, []):
            found[name].append(path)
    return found


def same_file(a: str, b: str) -> bool:
    try:
        return Path(a).samefile(b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def mapped_vs_cache(mapped: Mapping[str, list[str]], cache: Mapping[str, list[str]]) -> list[str]:
    """Problems where a mapped library is not the file the loader cache gives for its soname.

    For each mapped file, the cache entries of the same stem are looked up; a mapped file that is none
    of them means the process got that library from elsewhere (RPATH, LD_LIBRARY_PATH, a wheel).
    """
    problems: list[str] = []
    for name, paths in mapped.items():
        cached = [p for soname, ps in cache.items() if stem(soname) == name for p in ps]
        for path in paths:
            if cached and not any(same_file(path, c) for c in cached):
                problems.append(f"{name}: process maps {path}, loader cache has {', '.join(sorted(set(cached)))}")
    return problems


def copies_in_cache(cache: Mapping[str, list[str]], name: str) -> list[str]:
    """Distinct real files the loader cache offers for library stem `name` (several = ambiguity)."""
    files: dict[str, str] = {}
    for soname, paths in cache.items():
        if stem(soname) != name:
            continue
        for path in paths:
            files.setdefault(os.path.realpath(path), path)
    return sorted(files)


class _LinkMap(ctypes.Structure):
    _fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p)]


_RTLD_DI_LINKMAP = 2


def dlopen_path(lib: ctypes.CDLL) -> str:
    """The file a loaded library really came from (dlinfo RTLD_DI_LINKMAP), "" if unknown."""
    for host in (None, "libdl.so.2"):
        try:
            dlinfo = ctypes.CDLL(host).dlinfo
        except (OSError, AttributeError):
            continue
        dlinfo.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        dlinfo.restype = ctypes.c_int
        link = ctypes.POINTER(_LinkMap)()
        if dlinfo(ctypes.c_void_p(lib._handle), _RTLD_DI_LINKMAP, ctypes.byref(link)) == 0 and link:
            name = link.contents.l_name
            return name.decode() if name else ""
    return ""


def self_maps(stems: Iterable[str] = TRACKED) -> dict[str, list[str]]:
    try:
        return parse_maps(bounded.read_text(Path("/proc/self/maps"), MAPS_BYTES, lenient=True), stems)
    except bounded.Unreadable:
        return {}
