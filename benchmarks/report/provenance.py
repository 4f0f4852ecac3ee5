"""Where a result came from: the host, device, date and command named above each generated table."""

from __future__ import annotations

from typing import Any

UNKNOWN = "not recorded"


def _machine(result: dict[str, Any]) -> dict[str, Any]:
    machine = result.get("machine") or result.get("host")
    return machine if isinstance(machine, dict) else {}


def _derived(result: dict[str, Any]) -> bool:
    """A result computed from other result files (a model fitted on accounts), not measured on a host."""
    return not _machine(result) and ("account" in result or "fit_account" in result)


def host_of(result: dict[str, Any]) -> str:
    """The CPU and its logical cores, from the JSON's ``machine`` (or ``host``) record."""
    machine = _machine(result)
    if not machine:
        return "none: derived from the files it names" if _derived(result) else UNKNOWN
    cpu = machine.get("cpu") or machine.get("processor") or UNKNOWN
    cores = machine.get("logical_cpus") or machine.get("cpu_count")
    return f"{cpu.replace('(R)', '')}, {cores} logical CPUs" if cores else cpu


def device_of(result: dict[str, Any]) -> str:
    """The accelerator the run used (a GPU's name), else ``CPU``; a result derived from others is modeled."""
    machine = _machine(result)
    gpu = machine.get("device") or machine.get("gpu") or machine.get("cuda") or result.get("device")
    if _derived(result):
        return f"{gpu}, modeled" if gpu else "none, modeled"
    return str(gpu) if gpu else ("CPU" if machine else UNKNOWN)


def date_of(result: dict[str, Any]) -> str:
    """The run's date: the JSON's ``date``, else its machine record's."""
    date = result.get("date") or _machine(result).get("date")
    return str(date)[:10] if date else UNKNOWN


def command_of(result: dict[str, Any]) -> str | None:
    """The command line the JSON records, if any."""
    command = result.get("command")
    return " ".join(command) if isinstance(command, list) else command


def _joined(values: list[str]) -> str:
    return ", ".join(dict.fromkeys(values))


def heading_line(results: list[dict[str, Any]], sources: list[str]) -> str:
    """One line under a section's heading: the source files, their hosts, devices and dates, the command of one."""
    dates = sorted({date_of(result) for result in results})
    parts = [f"Source: {', '.join(f'`{source}`' for source in sources)}",
             f"host: {_joined([host_of(r) for r in results])}", f"device: {_joined([device_of(r) for r in results])}",
             f"date: {dates[0] if len(dates) == 1 else f'{dates[0]} to {dates[-1]}'}"]
    command = command_of(results[0]) if len(results) == 1 else None
    return " · ".join(parts) + (f" · command: `{command}`" if command else "")
