"""How much memory this process may still allocate: the machine's and its cgroup's.

``/proc/meminfo`` describes the machine; a container (Docker, Kubernetes, a batch job)
usually runs under a smaller cgroup limit, and going past that gets the process killed
by the kernel, with no message. Both are read, and the smaller wins:

* cgroup v2: ``memory.max`` minus ``memory.current`` (less the reclaimable
  ``inactive_file`` cache of ``memory.stat``), for the process's cgroup and every parent;
* cgroup v1: ``memory.limit_in_bytes`` minus ``memory.usage_in_bytes`` (less
  ``total_inactive_file``), likewise.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["available_memory", "cgroup_available"]

_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a number near 2**63


def available_memory(
    proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """Bytes a new allocation can get now (the least of the machine's ``MemAvailable`` and
    every cgroup limit's headroom), or None when nothing says."""
    found = [v for v in (_meminfo_available(proc), cgroup_available(proc, cgroup_root)) if v]
    return min(found) if found else _sysconf_available()


def _meminfo_available(proc: Path) -> int | None:
    """``MemAvailable`` (kB -> bytes): free memory plus the page cache the kernel gives
    back; the free pages alone would refuse scans on a machine full of cached files."""
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _sysconf_available() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def cgroup_available(
    proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """Bytes left under the tightest cgroup memory limit of this process (v2 or v1), or
    None when no limit is set or none can be read."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    headroom = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":  # v2: "0::/path"
            headroom += _headrooms(cgroup_root, parts[2], _V2)
        elif "memory" in parts[1].split(","):  # v1: "4:memory:/path"
            headroom += _headrooms(cgroup_root / "memory", parts[2], _V1)
    return max(0, min(headroom)) if headroom else None


# (limit file, usage file, reclaimable cache key in memory.stat)
_V2 = ("memory.max", "memory.current", "inactive_file")
_V1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")


def _headrooms(mount: Path, relative: str, files: tuple[str, str, str]) -> list[int]:
    """Limit minus usage of the cgroup at ``mount/relative`` and of each parent up to the
    mount. Inside a container the path printed may not exist (its cgroup is the mount's
    root): the folders that do exist are read."""
    folder = mount / relative.strip("/")
    folders = [folder, *folder.parents]
    found = []
    for f in folders:
        if not f.is_relative_to(mount):
            break
        limit = _read_int(f / files[0])
        if limit is None or limit >= _NO_LIMIT:
            continue
        usage = _read_int(f / files[1]) or 0
        usage -= _stat_value(f / "memory.stat", files[2])
        found.append(limit - max(usage, 0))
    return found


def _read_int(path: Path) -> int | None:
    """An integer file's value; None for "max" (v2's no limit) or when it cannot be read."""
    try:
        text = path.read_text().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _stat_value(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0
