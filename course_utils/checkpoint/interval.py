"""How often to checkpoint: Young and Daly's interval, ``sqrt(2 * C * M)``.

Taught in chapter 08 (section 8, what changes at cluster scale).
"""

from __future__ import annotations

__all__ = ["young_daly_interval"]


def young_daly_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """How often to checkpoint: ``sqrt(2 * C * M)`` seconds between checkpoints (Young 1974, Daly 2006).

    Saving every ``tau`` seconds costs ``C / tau`` of the time; a failure, every ``M`` seconds
    on average, loses ``tau / 2`` of work on average, ``tau / (2 M)`` of the time. The sum is
    smallest at ``tau = sqrt(2 C M)`` (first order, for ``C`` much smaller than ``M``).
    """
    if save_seconds <= 0 or mtbf_seconds <= 0:
        raise ValueError(
            f"save_seconds and mtbf_seconds must be positive, got {save_seconds}, {mtbf_seconds}"
        )
    return (2.0 * save_seconds * mtbf_seconds) ** 0.5
