"""Process-memory and machine probes shared by the benchmarks (Linux; no torch import here).

Every benchmark runs as a module from the checkout (``python -m benchmarks.training.layer_speed``)
and imports this one as ``benchmarks.probes``; a worker process is started the same way
(``module_command``). ``machine_basics()`` is the one description of the machine every result carries.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

GB = 1e9
ROOT = Path(__file__).resolve().parent.parent  # the checkout
RESULTS = ROOT / "benchmarks" / "results"
RESULT_TAG = "RESULT "  # marks the one stdout line of a worker process that carries its JSON result


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


def today() -> str:
    """The UTC date, ISO format: the ``date`` of a results file."""
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def machine_basics() -> dict[str, object]:
    """CPU model, logical CPUs, RAM, Python version, 1-minute load and the UTC date: what every benchmark reports."""
    return {
        "date": today(),
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count() or 0,
        "mem_total_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB, 1),
        "python": platform.python_version(),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def print_result(result: dict) -> None:
    """A worker process's answer: one tagged JSON line on stdout."""
    print(RESULT_TAG + json.dumps(result), flush=True)


def spawn_measured(command: list[str], label: str, identity: dict) -> dict:
    """Run a worker process: its result with ``status`` "measured" and ``wall_s``, or ``identity`` with how it failed."""
    print(f"  process: {label} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = round(time.perf_counter() - start, 1)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return {**json.loads(line[len(RESULT_TAG):]), "status": "measured", "wall_s": wall}
    tail = (proc.stderr or proc.stdout)[-2000:]
    oom = proc.returncode in (-9, 137) or "can't allocate memory" in tail or "MemoryError" in tail
    status = "out of memory" if oom else f"failed (exit {proc.returncode})"
    print(f"  {label}: {status}\n{tail}", file=sys.stderr, flush=True)
    return {**identity, "status": status, "returncode": proc.returncode, "stderr_tail": tail}


def module_command(module: str) -> list[str]:
    """``python -m <module>``: how a benchmark starts its worker processes (``spawn_measured`` puts the checkout on the path)."""
    return [sys.executable, "-m", module]


def command_line(argv: list[str] | None = None) -> str:
    """The command that ran, for a results JSON: ``python -m <module>`` or paths relative to the checkout (no absolute paths)."""
    root = str(ROOT)
    parts = list(sys.argv if argv is None else argv)
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if argv is None and parts and spec is not None and spec.name:
        parts = ["-m", spec.name.removesuffix(".__main__"), *parts[1:]]
    parts = ["python", *parts]
    return " ".join(os.path.relpath(p, root) if os.path.isabs(p) and p.startswith(root) else p for p in parts)


def without_out(argv: list[str] | None = None) -> list[str]:
    """A benchmark's arguments (``sys.argv[1:]`` by default) without ``--out PATH``: no local paths in a results JSON."""
    given = list(sys.argv[1:] if argv is None else argv)
    return [a for i, a in enumerate(given) if not a.startswith("--out") and (i == 0 or given[i - 1] != "--out")]


def write_result(out: Path | str | None, result: dict, table: str) -> None:
    """A results JSON at ``out`` and its markdown table beside it (``.md``), then the table printed; only printed when
    ``out`` is None."""
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        out.with_suffix(".md").write_text(table)
    print(table + (f"\nwrote {out} and {out.with_suffix('.md')}" if out is not None else ""))


@contextlib.contextmanager
def environment(**variables: str) -> Iterator[None]:
    """Environment variables set to these values inside the block, as they were after it."""
    before = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
