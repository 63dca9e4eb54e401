"""Sliders for a figure: one ``update(**knobs)`` function, shown static or live.

Every explorer of the course is a plain function ``draw(**knobs) -> Figure`` that lives in
``course_utils`` and is tested like any other; this module only puts sliders in front of it.

    explore(draw, {"m": (1, 32, 1, 8), "schedule": ["GPipe", "1F1B"]})

A control is ``(min, max, step, default)`` for a number (an ``IntSlider`` when all four are ints,
else a ``FloatSlider``), ``(min, max, default)`` for a power-of-two size (``log2`` slider), or a
list of choices (a dropdown, the first is the default). ``explore`` first draws the figure at the
defaults, so an executed notebook, its HTML export and a reader without a kernel all see it; with
``ipywidgets`` (7.7 on Colab, 8.1 on Kaggle and JupyterLab: both work) the sliders then redraw it.

Taught in chapters 02, 06 and 07 (behind their explorers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["Number", "PowerOfTwo", "Choice", "controls_from", "defaults", "live", "explore"]


@dataclass(frozen=True)
class Number:
    """A slider from ``low`` to ``high`` in steps of ``step``, starting at ``value``."""

    low: float
    high: float
    step: float
    value: float

    def __post_init__(self):
        if not self.low <= self.value <= self.high or self.step <= 0:
            raise ValueError(f"need low <= value <= high and step > 0, got {self}")

    @property
    def integer(self) -> bool:
        return all(isinstance(x, int) for x in (self.low, self.high, self.step, self.value))


@dataclass(frozen=True)
class PowerOfTwo:
    """A size slider over ``2**k`` from ``low`` to ``high`` (both powers of two), starting at ``value``."""

    low: int
    high: int
    value: int

    def __post_init__(self):
        for x in (self.low, self.high, self.value):
            if x <= 0 or x & (x - 1):
                raise ValueError(f"{x} is not a power of two")
        if not self.low <= self.value <= self.high:
            raise ValueError(f"need low <= value <= high, got {self}")


@dataclass(frozen=True)
class Choice:
    """A dropdown over ``options``; the first is the default."""

    options: tuple

    @property
    def value(self):
        return self.options[0]


Control = Number | PowerOfTwo | Choice


def controls_from(spec: Mapping[str, object]) -> dict[str, Control]:
    """``{name: Number | PowerOfTwo | Choice}`` from the short forms in the module docstring."""
    out: dict[str, Control] = {}
    for name, c in spec.items():
        if isinstance(c, Number | PowerOfTwo | Choice):
            out[name] = c
        elif isinstance(c, list):
            out[name] = Choice(tuple(c))
        elif isinstance(c, tuple) and len(c) == 4:
            out[name] = Number(*c)
        elif isinstance(c, tuple) and len(c) == 3:
            out[name] = PowerOfTwo(*c)
        else:
            raise ValueError(
                f"control {name!r}: give (min, max, step, default), (min, max, default) for a power "
                f"of two, or a list of choices; got {c!r}"
            )
    return out


def defaults(spec: Mapping[str, object]) -> dict[str, object]:
    """Each control's starting value."""
    return {name: c.value for name, c in controls_from(spec).items()}


def _widget(name: str, c: Control):
    import ipywidgets as w

    style = {"description_width": "initial"}
    if isinstance(c, Choice):
        return w.Dropdown(options=list(c.options), value=c.value, description=name, style=style)
    if isinstance(c, PowerOfTwo):
        return w.IntSlider(
            min=int(math.log2(c.low)),
            max=int(math.log2(c.high)),
            value=int(math.log2(c.value)),
            description=f"log2 {name}",
            style=style,
            continuous_update=False,
        )
    kind = w.IntSlider if c.integer else w.FloatSlider
    return kind(
        min=c.low,
        max=c.high,
        step=c.step,
        value=c.value,
        description=name,
        style=style,
        continuous_update=False,
    )


def _value(c: Control, raw):
    return 2 ** int(raw) if isinstance(c, PowerOfTwo) else raw


def live(draw: Callable[..., object], spec: Mapping[str, object], fixed: Mapping[str, object] | None = None):
    """The sliders and the output area that ``draw`` redraws into: ``(box, sliders, output)``.

    Moving a slider calls ``draw(**values, **fixed)`` and shows its figure in ``output``.
    Raises ``ImportError`` without ipywidgets.
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    controls, fixed = controls_from(spec), dict(fixed or {})
    sliders = {name: _widget(name, c) for name, c in controls.items()}
    output = w.Output()

    def redraw(change=None):
        values = {name: _value(controls[name], s.value) for name, s in sliders.items()}
        with output:
            output.clear_output(wait=True)
            fig = draw(**values, **fixed)
            display(fig)
            plt.close(fig)

    for s in sliders.values():
        s.observe(redraw, names="value")
    names = list(sliders.values())
    rows = [w.HBox(names[i : i + 3]) for i in range(0, len(names), 3)]
    return w.VBox([*rows, output]), sliders, output


def explore(
    draw: Callable[..., object], spec: Mapping[str, object], fixed: Mapping[str, object] | None = None
):
    """Show ``draw(**defaults, **fixed)``; then, where ipywidgets is installed, sliders that redraw it.

    ``fixed`` passes arguments that have no slider (e.g. measured points to draw on the same axes).
    Returns nothing, so a cell that ends with it shows only the figure and the sliders.
    """
    import matplotlib.pyplot as plt
    from IPython.display import display

    figure = draw(**defaults(spec), **dict(fixed or {}))
    display(figure)
    plt.close(figure)
    try:
        box, _, _ = live(draw, spec, fixed)
    except ImportError:
        print("Install ipywidgets (pip install ipywidgets) to move these knobs.")
        return
    display(box)
