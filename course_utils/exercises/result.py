"""What a "build it" checker hands back: passed or not, what was checked, what differs.

``CheckResult`` is true when the learner's function passed; ``str(result)`` is the report a
checker prints: one line ``passed: ...`` saying what was checked, or ``not yet: ...`` and one
plain sentence per difference found (never the reference's code).

Taught in chapters 02, 03, 04, 05, 06, 07 and 08 (their "build it" exercises).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["CheckResult", "close", "show_values"]


@dataclass
class CheckResult:
    """exercise: the function's name; checked: what was compared, in words; problems: one
    sentence per difference found (empty when ``passed``)."""

    exercise: str
    checked: str
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.passed

    def note(self, problem: str | None) -> None:
        """Record ``problem`` (one sentence), if there is one."""
        if problem:
            self.problems.append(problem)

    def shown(self) -> CheckResult:
        """Print the report (``str(self)``) and return this result: what ``check_<name>`` does."""
        print(self)
        return self

    def __str__(self) -> str:
        if self.passed:
            return f"passed: {self.exercise} {self.checked}"
        return "\n".join([f"not yet: {self.exercise}"] + [f"- {p}" for p in self.problems])


def close(got, expected, rtol: float = 1e-5, atol: float = 1e-6) -> bool:
    """Whether ``got`` is a tensor of ``expected``'s shape with its values (float tolerance)."""
    return (
        isinstance(got, torch.Tensor)
        and got.shape == expected.shape
        and torch.allclose(got.double(), expected.double(), rtol=rtol, atol=atol)
    )


def show_values(t: torch.Tensor, limit: int = 6) -> str:
    """A tensor's first values, short: ``[1, 2.5, 3, ...]``."""
    flat = t.detach().reshape(-1).tolist()
    text = ", ".join(f"{v:g}" for v in flat[:limit])
    return f"[{text}{', ...' if len(flat) > limit else ''}]"


def ratio(got: torch.Tensor, expected: torch.Tensor) -> float | None:
    """The one number ``k`` with ``got == k * expected`` everywhere (where expected is not 0),
    or None when there is none (or ``k`` is 1)."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return None
    nonzero = expected.abs() > 1e-6
    if not nonzero.any() or not torch.allclose(got[~nonzero].double(), torch.zeros(1, dtype=torch.float64)):
        return None
    k = (got[nonzero].double() / expected[nonzero].double()).mean().item()
    if abs(k - 1) < 1e-4 or not torch.allclose(got.double(), k * expected.double(), rtol=1e-4, atol=1e-6):
        return None
    return k
