"""Sources of the numbers in quiz/chapter00-answers.md (see tests/test_quiz_figures.py)."""

FIGURES = {}
