"""Interactive explorers: knobs in front of the course's closed forms and simulators.

Each explorer is a tested function that returns a figure (``draw_pipeline``, ``draw_allreduce``,
``draw_sharding``) plus a ``CONTROLS`` table; ``explore(draw, CONTROLS)`` shows the figure at
the default values and, with ipywidgets, sliders that redraw it.

Taught in chapters 02, 06 and 07 (one explorer each).
"""

from course_utils.notebook.widgets import explore, live

__all__ = ["explore", "live"]
