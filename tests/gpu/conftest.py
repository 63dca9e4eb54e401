"""GPU tests: marked ``gpu(n)`` and skipped where fewer than n CUDA GPUs are visible.

Run them on a GPU machine with ``python -m pytest tests/gpu -m gpu -v``. They share
``tests/helpers/`` with the CPU tests and run some CPU tests again (``run_cpu_tests``), which is
why ``tests/`` is put on the path.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pytest_collection_modifyitems(config, items):
    from course_utils import gpu_count

    have = gpu_count()
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is not None:
            need = marker.args[0] if marker.args else 1
            if have < need:
                item.add_marker(pytest.mark.skip(reason=f"needs {need} CUDA GPU(s); {have} visible"))
