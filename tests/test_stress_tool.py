"""tools/stress.py: junit parsing, failure classification, the failure-rate bound, one real run.

No notebook is run: the junit reports are small hand-written strings in the shapes pytest and
nbval write them, and the end-to-end run is a throwaway test file that fails on its second run.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.chapter(), pytest.mark.launches]

TOOL = Path(__file__).resolve().parent.parent / "tools" / "stress.py"


def _load_tool():
    spec = importlib.util.spec_from_file_location("stress_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


stress = _load_tool()

# nbval's report of a cell that raised, as pytest's junit writer stores it: colour codes spelled "#x1B",
# the cell's input (which names SIGKILL: it must not count), then IPython's traceback.
NBVAL_SIGNAL = """\
<testcase classname="chapters.04_ddp.ipynb" name="Cell 13" time="3.1">
<failure message="#x1B[91mNotebook cell execution failed#x1B[0m&#10;[+20 more lines]">\
#x1B[91mNotebook cell execution failed#x1B[0m
#x1B[94mCell 13: Cell execution caused an exception

Input:
#x1B[0mresults = launch(train, world_size=2, timeout=60)  # a rank killed with SIGKILL would show here

#x1B[94mTraceback:#x1B[0m

#x1B[31m---------------------------------------------------------------------------#x1B[39m
#x1B[31mRankFailedError#x1B[39m                           Traceback (most recent call last)
#x1B[32m----&gt; #x1B[39m#x1B[32m1#x1B[39m results = launch(train, world_size=2, timeout=60)  # SIGKILL

#x1B[31mRankFailedError#x1B[39m: rank 1 failed with ProcessExit: the process was killed by signal SIGABRT \
without a Python exception

--- rank 1 ---
(no Python traceback)
</failure>
</testcase>"""

# pytest's report of a failed assert: the message has no type; the crash line names it
PYTEST_ASSERT = """\
<testcase classname="tests.test_launch.TestErrors" name="test_names_rank[2]" time="0.4">
<failure message="assert 1 == 2">def test_names_rank(self):
    # would raise SIGSEGV in the old launcher
&gt;       assert 1 == 2
E       assert 1 == 2

tests/test_launch.py:40: AssertionError</failure>
</testcase>"""

PASSED = '<testcase classname="chapters.04_ddp.ipynb" name="Cell 12" time="0.2"/>'

NBVAL_MISMATCH = """\
<testcase classname="chapters.08_fault_tolerance_and_scale_out.ipynb" name="Cell 14" time="9.0">
<failure message="Notebook cell execution failed">Notebook cell execution failed
Cell 14: Cell outputs differ

Input:
print(report)

Traceback:
 mismatch 'stdout'

 assert reference_output == test_output failed:

  - rank 1 killed itself with SIGKILL before step 14
  + rank 1 killed itself with SIGKILL before step 15
</failure>
</testcase>"""


def junit(*cases: str) -> str:
    body = "\n".join(cases)
    return f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{body}</testsuite></testsuites>'


def test_parse_junit_classifies_signal_exception_and_pass():
    (dead,) = stress.parse_junit(junit(PASSED, NBVAL_SIGNAL), "chapters/04_ddp.ipynb", 3)
    (assertion,) = stress.parse_junit(junit(PYTEST_ASSERT), "tests/test_launch.py", 3)
    assert (dead.test, dead.kind, dead.run) == ("Cell 13", "SIGABRT", 3)
    assert (assertion.test, assertion.kind) == ("TestErrors::test_names_rank[2]", "AssertionError")
    assert (dead.signal, dead.exception) == ("SIGABRT", "RankFailedError")
    assert dead.message == (
        "RankFailedError: rank 1 failed with ProcessExit: the process was killed by signal SIGABRT "
        "without a Python exception"
    )
    assert (assertion.signal, assertion.exception, assertion.message) == (
        None,
        "AssertionError",
        "assert 1 == 2",
    )


def test_test_ids_of_notebooks_modules_and_classes():
    assert stress.test_id("chapters.04_ddp.ipynb", "Cell 13", "chapters/04_ddp.ipynb") == "Cell 13"
    assert stress.test_id("tests.test_launch", "test_x[a]", "tests/test_launch.py") == "test_x[a]"
    assert stress.test_id("tests.test_launch.TestK", "test_x", "tests/test_launch.py") == "TestK::test_x"
    assert stress.test_id("test_flaky", "test_x", "/tmp/t/test_flaky.py") == "test_x"


def test_output_diff_and_cell_source_naming_a_signal_are_not_a_signal():
    (failure,) = stress.parse_junit(
        junit(NBVAL_MISMATCH), "chapters/08_fault_tolerance_and_scale_out.ipynb", 1
    )
    assert (failure.test, failure.kind, failure.signal) == ("Cell 14", "OutputMismatch", None)
    assert failure.message == "Cell outputs differ: mismatch 'stdout'"


def test_message_and_error_lines_give_type_and_signal():
    kind, exception, sig, message = stress.classify(
        "failure",
        "RuntimeError: rank 0: the process was killed by signal SIGSEGV",
        "E   RuntimeError: rank 0: the process was killed by signal SIGSEGV\n\ntests/t.py:3: RuntimeError",
    )
    assert (kind, exception, sig) == ("SIGSEGV", "RuntimeError", "SIGSEGV")
    assert message == "RuntimeError: rank 0: the process was killed by signal SIGSEGV"
    # SIGNAL is a word, not a signal; a setup error takes its type from its E line
    kind, exception, sig, _ = stress.classify(
        "error", 'failed on setup with "ValueError: SIGNAL lost"', "E   ValueError: SIGNAL lost"
    )
    assert (kind, exception, sig) == ("ValueError", "ValueError", None)


def test_timeout_and_bad_exit_codes_are_failures():
    (timeout,) = stress.run_failures("t.py", 2, None, None, "t.py::test_a PASSED\nt.py::test_hangs ", 900)
    assert (timeout.test, timeout.kind) == ("test_hangs", "timeout")
    (usage,) = stress.run_failures("t.py", 1, 4, None, "ERROR: file or directory not found: t.py\n", 900)
    assert usage.kind == "exit 4" and "not found" in usage.message
    (killed,) = stress.run_failures("t.py", 1, -11, None, "", 900)
    assert (killed.kind, killed.signal) == ("SIGSEGV", "SIGSEGV")
    assert stress.run_failures("t.py", 1, 0, junit(PASSED), "", 900) == []


def _binom_cdf_by_hand(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def _beta_cdf_by_simpson(a: int, b: int, x: float, steps: int = 20_000) -> float:
    """P(Beta(a, b) <= x) by Simpson's rule on the density: independent of any binomial sum."""
    norm = math.gamma(a + b) / (math.gamma(a) * math.gamma(b))
    h = x / steps
    f = [norm * (i * h) ** (a - 1) * (1 - i * h) ** (b - 1) for i in range(steps + 1)]
    return h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))


def test_zero_failures_bound_is_the_rule_of_three():
    assert stress.upper_bound(0, 30) == pytest.approx(0.0950, abs=5e-5)
    assert stress.upper_bound(0, 30) == pytest.approx(1 - 0.05 ** (1 / 30))
    assert stress.upper_bound(0, 300) == pytest.approx(3 / 300, rel=0.01)
    assert stress.upper_bound(30, 30) == 1.0


def test_clopper_pearson_one_sided_upper_limit():
    """k=1, n=30: one-sided 95% is 0.1486 (P(X <= 1; 30, p) = 0.05); the two-sided convention's 0.1722."""
    p = stress.upper_bound(1, 30)
    assert p == pytest.approx(0.14860, abs=5e-5)
    assert _binom_cdf_by_hand(1, 30, p) == pytest.approx(0.05, abs=1e-9)
    # the same limit is the 95% quantile of Beta(k+1, n-k) = Beta(2, 29)
    assert _beta_cdf_by_simpson(2, 29, p) == pytest.approx(0.95, abs=1e-6)
    assert stress.upper_bound(1, 30, confidence=0.975) == pytest.approx(0.17217, abs=5e-5)
    p = stress.upper_bound(4, 500)
    assert _binom_cdf_by_hand(4, 500, p) == pytest.approx(0.05, abs=1e-9)


FLAKY = """\
from pathlib import Path

COUNTER = Path(__file__).with_name("runs.txt")


def test_fails_on_second_run():
    runs = int(COUNTER.read_text()) + 1 if COUNTER.exists() else 1
    COUNTER.write_text(str(runs))
    if runs == 2:
        raise RuntimeError("rank 1 was killed by signal SIGABRT")
"""


def test_two_real_runs_count_one_failure(tmp_path):
    flaky = tmp_path / "test_flaky.py"
    flaky.write_text(FLAKY)
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(TOOL), "--runs", "2", "--timeout", "120", "--json", str(report), str(flaky)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "run 1/2  passed" in done.stdout
        and "run 2/2  FAILED (test_fails_on_second_run SIGABRT)" in done.stdout
    )
    assert "rate 50.0% observed" in done.stdout
    (target,) = json.loads(report.read_text())["targets"].values()
    assert (target["runs"], target["failed_runs"]) == (2, 1)
    assert target["failures"] == [
        {
            "test": "test_fails_on_second_run",
            "kind": "SIGABRT",
            "count": 1,
            "runs": [2],
            "message": "RuntimeError: rank 1 was killed by signal SIGABRT",
        }
    ]
