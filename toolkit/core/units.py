"""Human-readable numbers for reports: rates that never print as a misleading ``0.0``."""
from __future__ import annotations


def format_rate(value: float) -> str:
    """Three significant figures below 100 (``0.0432``, ``3.71``, ``64.5``), whole numbers above."""
    if value >= 100:
        return f"{value:.0f}"
    if value <= 0:
        return "0"
    return f"{value:.3g}" if value >= 0.001 else f"{value:.1e}"
