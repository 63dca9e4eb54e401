"""The threads-against-processes measurement (course_utils.gil): all three layouts timed alike."""

import pytest

from course_utils.gil import LAYOUTS, PythonWork, threads_vs_processes


def test_every_layout_is_timed_inside_launched_ranks_and_the_gil_stops_python_threads():
    result = threads_vs_processes(PythonWork(1_500_000), repeats=2)
    assert set(LAYOUTS) <= set(result) and all(result[k] > 0 for k in LAYOUTS)
    assert result["threads_speedup"] == pytest.approx(result["sequential"] / result["threads"])
    # pure Python: one thread holds the GIL at a time, so two threads keep at most one core busy
    assert result["threads_cores"] < 1.15, result
    assert result["threads_speedup"] < 1.5, result


def test_repeats_must_be_positive():
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        threads_vs_processes(PythonWork(10), repeats=0)
