"""The notebook layer: what a chapter uses to show and check, over the runtime.

* ``show``: ``show_source`` / ``show_diff`` (the package's code, shown in a notebook),
  ``environment``;
* ``marks``: ``varies``, the ``⏱``/``⚙`` markers of machine-dependent values;
* ``progress``: one line that updates while a long cell runs;
* ``quiz``: each chapter's quiz, checked (``quiz.check(4, "ABDC...")``);
* ``widgets``: the sliders of the explorers.

Layer 1 of CONTRIBUTING.md's tree: imports only ``course_utils.runtime`` (``lint-imports`` checks it).

Taught in chapter 00 (``show_source``, the quizzes).
"""
