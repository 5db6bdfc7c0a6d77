"""What a bitsandbytes load did that a user should know about, collected for the load report."""
from __future__ import annotations

from dataclasses import dataclass, field

MAX_NAMES = 4  # a note lists a few tensor names, then a count


@dataclass
class NoteLog:
    """Shared by a scheme and the parameters it creates; ``lines()`` becomes ``report.notes``."""

    requantized: list[str] = field(default_factory=list)
    unnested: list[str] = field(default_factory=list)
    quantized_on_load: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        notes = []
        if self.requantized:
            notes.append(f"bnb: re-quantized {_names(self.requantized)}: the tensor-parallel slice cuts 4-bit "
                         "quant blocks, so the rank's slice was dequantized and quantized again (not bit-exact)")
        if self.unnested:
            notes.append(f"bnb: double-quant statistics of {_names(self.unnested)} kept as float32 for the "
                         "tensor-parallel slice (exact)")
        if self.quantized_on_load:
            notes.append(f"bnb: {_names(self.quantized_on_load)} stored unquantized in the checkpoint, "
                         "quantized on load")
        return notes


def _names(names: list[str]) -> str:
    unique = list(dict.fromkeys(names))
    shown = ", ".join(unique[:MAX_NAMES])
    more = len(unique) - MAX_NAMES
    return f"{len(unique)} tensor(s) ({shown}{f', and {more} more' if more > 0 else ''})"
