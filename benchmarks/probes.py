"""Process-memory and machine probes shared by the benchmark scripts (Linux; no torch import here).

The scripts run as files (``python benchmarks/x.py``), are loaded by path in tests, and run as
modules under ``python -m benchmarks.run``; they find this module beside themselves.
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform
import resource
from pathlib import Path

GB = 1e9


def rss_now() -> int:
    """Current resident set size of this process in bytes."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_peak() -> int:
    """Peak resident set size of this process so far, in bytes (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def release_free_memory() -> None:
    """Collect garbage and hand the allocator's free heap pages back to the OS (glibc only)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _proc_field(path: str, field: str) -> int:
    """A ``kB`` field of a /proc file, in bytes; 0 if unknown."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def vm_hwm() -> int:
    """Peak resident set size of this process's address space (``VmHWM``), in bytes; 0 if unknown."""
    return _proc_field("/proc/self/status", "VmHWM")


def reset_peak() -> bool:
    """Reset this address space's peak RSS (``VmHWM``) to the current RSS (Linux >= 4.0); False where unsupported.

    ``ru_maxrss`` follows, unless the high-water mark carried over from before ``exec`` is higher.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def mem_available() -> int:
    """MemAvailable from /proc/meminfo in bytes (0 if unknown)."""
    return _proc_field("/proc/meminfo", "MemAvailable")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_basics() -> dict[str, object]:
    """CPU model, logical CPUs, RAM, Python version and 1-minute load: what every benchmark reports."""
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count() or 0,
        "mem_total_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB, 1),
        "python": platform.python_version(),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }
