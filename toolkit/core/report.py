"""The load report: per-phase timings, bytes read, throughput, tensors mapped, notes."""
from __future__ import annotations

import time
from contextlib import contextmanager

from .records import Record
from .units import format_rate


class LoadReport(Record):
    """What a load did and how long each phase took. A hand-written record, not a dataclass: every
    load imports this module (records.py says why)."""

    format: str
    architecture: str
    scheme: str
    files: list[str]
    phases: dict[str, float]
    # perf_counter() when each phase first began: a benchmark times a span that starts at a phase
    # (bench/bench_load_phases.py measures from ``build`` on, where llama.cpp's load time starts)
    phase_starts: dict[str, float]
    bytes_read: int
    tensors_mapped: int
    tensors_skipped: int
    num_parameters: int
    parameter_bytes: int
    notes: list[str]

    def __init__(self, format: str = "", architecture: str = "", scheme: str = "", files: list[str] | None = None,
                 phases: dict[str, float] | None = None, phase_starts: dict[str, float] | None = None,
                 bytes_read: int = 0, tensors_mapped: int = 0, tensors_skipped: int = 0, num_parameters: int = 0,
                 parameter_bytes: int = 0, notes: list[str] | None = None):
        self.format = format
        self.architecture = architecture
        self.scheme = scheme
        self.files = [] if files is None else files
        self.phases = {} if phases is None else phases
        self.phase_starts = {} if phase_starts is None else phase_starts
        self.bytes_read = bytes_read
        self.tensors_mapped = tensors_mapped
        self.tensors_skipped = tensors_skipped
        self.num_parameters = num_parameters
        self.parameter_bytes = parameter_bytes
        self.notes = [] if notes is None else notes

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        self.phase_starts.setdefault(name, start)
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - start

    @property
    def total_seconds(self) -> float:
        return sum(self.phases.values())

    @property
    def gb_per_second(self) -> float:
        seconds = self.phases.get("load_weights", 0.0)
        return self.bytes_read / seconds / 1e9 if seconds > 0 else 0.0

    def summary_lines(self) -> list[str]:
        phases = ", ".join(f"{name} {seconds:.2f}s" for name, seconds in self.phases.items())
        lines = [f"architecture  {self.architecture}", f"format        {self.format}", f"scheme        {self.scheme}",
                 f"parameters    {self.num_parameters / 1e6:.1f}M ({self.parameter_bytes / 2**20:.1f} MiB on device)",
                 f"read          {self.bytes_read / 2**20:.1f} MiB in {self.tensors_mapped} tensors "
                 f"({self.tensors_skipped} unused) at {format_rate(self.gb_per_second)} GB/s",
                 f"time          {self.total_seconds:.2f}s ({phases})"]
        return lines + [f"note          {note}" for note in self.notes]
