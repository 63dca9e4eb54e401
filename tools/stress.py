"""Run a chapter notebook or a test file N times in a row; report failures by file, cell (or test) and signal.

    python tools/stress.py --runs 30 chapters/04_ddp.ipynb tests/test_launch.py
    python tools/stress.py --runs 50 --env ATEN_CPU_CAPABILITY=default chapters/04_ddp.ipynb
    python tools/stress.py --runs 20 --stop-on-failure --timeout 600 --json /tmp/stress.json tests/test_ddp.py
    python tools/stress.py --runs 5 --pytest-args "-k allreduce" --log-dir /tmp/logs tests/test_collectives.py

Each run is one ``python -m pytest`` subprocess on one target, started from the repository root (so
pyproject.toml's addopts apply: the sanitize file and the cell timeout), with ``--nbval`` for a notebook
(its outputs are compared exactly as by the project's test command) and ``--junitxml`` to a temporary
file, from which the failures are read. A run that passes ``--timeout`` seconds is killed (its process
group, and the Jupyter kernel and ranks below it, which run in sessions of their own) and counts as a
failure of kind ``timeout``. A pytest exit code other than 0 and 1 (a collection error, an interruption,
pytest killed by a signal) also counts as a failure.

Each failure is recorded with its target, run number, cell or test id (nbval's ``Cell 13``) and kind:
the signal its error text names (``SIGABRT``, as the launcher reports a rank that died: "was killed by
signal SIGABRT"), else the exception type (``RankFailedError``, ``AssertionError``), else what nbval
reports (``OutputMismatch``, ``CellTimeout``); with the first line of its error message. Signals are
looked for in the error text only, not in a cell's source or an output diff (chapter 08's stored outputs
name SIGKILL).

The summary gives, per target, the runs, the failed runs, the failures by cell/test and kind, and the
upper bound the result puts on the per-run failure rate, at one-sided 95% confidence: with 0 failures in
n runs, 1 - 0.05**(1/n) (about 3/n); with k failures, the observed rate k/n and the Clopper-Pearson upper
limit, the p at which P(X <= k; n, p) = 0.05 (0.1486 for k=1, n=30; the upper end of a two-sided 95%
interval, which uses 0.025, is 0.1722). Exit code: 0 if every run passed, 1 otherwise.

Not taught in a chapter: maintainers' check of how often a flaky chapter or test fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIDENCE = 0.95

# pytest's junit writer turns the ESC of a colour code into the text "#x1B"; nbval colours its reports
_ANSI = re.compile(r"(?:\x1b|#x1B)\[[0-9;]*[A-Za-z]")
_SIGNAL = re.compile(r"\bSIG[A-Z0-9]+\b")
_SIGNAL_NAMES = set(signal.Signals.__members__)
_EXC_NAME = r"[A-Za-z_][\w.]*"
_IPYTHON_HEADER = re.compile(rf"^({_EXC_NAME})\s+Traceback \(most recent call last\)", re.M)
_EXC_LINE = re.compile(rf"^({_EXC_NAME}): ", re.M)
_CRASH_LINE = re.compile(rf"^\S+:\d+: ({_EXC_NAME})$", re.M)  # pytest's "tests/test_x.py:12: ValueError"
_NBVAL_FIRST_LINE = "Notebook cell execution failed"
_PYTEST_EXIT = {2: "interrupted", 3: "internal error", 4: "usage error", 5: "no tests collected"}


@dataclass
class Failure:
    """One failed cell or test of one run.

    ``kind``: the signal if the error names one, else the exception type, else nbval's reason
    (``OutputMismatch``, ``CellTimeout``), else ``timeout`` or the pytest exit; ``message``: one line.
    """

    target: str
    run: int
    test: str
    kind: str
    message: str
    exception: str | None = None
    signal: str | None = None


@dataclass
class RunResult:
    """One pytest run of one target."""

    target: str
    run: int
    seconds: float
    returncode: int | None  # None: killed at the timeout
    failures: list[Failure] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


# ---------------------------------------------------------------- classifying a junit failure


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes (real ESC bytes or junit's ``#x1B`` spelling of them)."""
    return _ANSI.sub("", text)


def find_signal(text: str) -> str | None:
    """The first signal name (``SIGSEGV``) in ``text``, or None; words like SIGNAL are not signals."""
    for match in _SIGNAL.finditer(text):
        if match.group() in _SIGNAL_NAMES:
            return match.group()
    return None


def first_line(text: str) -> str:
    """The first non-blank line of ``text``, stripped ('' if none)."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def raised_exception(traceback: str) -> tuple[str | None, str]:
    """(type, text) of the exception a traceback ends with; the text runs from ``Type: ...`` to the end.

    An IPython traceback names the type in its last header ("ValueError   Traceback (most recent
    call last)"); its message may span lines (the launcher's RankFailedError carries the rank's
    traceback). A plain traceback is read from its last ``Type: message`` line.
    """
    headers = list(_IPYTHON_HEADER.finditer(traceback))
    if headers:
        name = headers[-1].group(1)
        line = re.compile(rf"^(?:{_EXC_NAME}\.)?{re.escape(name)}(?::|$)", re.M)
        found = line.search(traceback, headers[-1].end())
        return name, traceback[found.start() :] if found else ""
    lines = list(_EXC_LINE.finditer(traceback))
    if lines:
        return lines[-1].group(1), traceback[lines[-1].start() :]
    return None, ""


def classify_nbval(text: str) -> tuple[str, str | None, str | None, str]:
    """(kind, exception, signal, message) of an nbval cell failure, from its report.

    The report: "Notebook cell execution failed", "Cell N: <reason>", the cell's input, and
    "Traceback:" with the kernel's traceback or the output diff. The input is never searched.
    """
    reason = re.search(r"^Cell \d+: (.*)$", text, re.M)
    reason = reason.group(1).strip() if reason else first_line(text)
    traceback = text.split("\nTraceback:\n", 1)[1] if "\nTraceback:\n" in text else ""
    if "outputs differ" in reason:
        mismatch = next((line.strip() for line in traceback.splitlines() if "mismatch" in line), "")
        return "OutputMismatch", None, None, f"{reason}: {mismatch}" if mismatch else reason
    if reason.startswith("Timeout"):
        return "CellTimeout", None, None, reason
    exception, raised = raised_exception(traceback)
    sig = find_signal(raised or reason)
    return sig or exception or "CellError", exception, sig, first_line(raised) or reason


def classify_pytest(tag: str, message: str, text: str) -> tuple[str, str | None, str | None, str]:
    """(kind, exception, signal, message) of a pytest test failure (``tag``: failure or error).

    The exception type comes from the message ("RuntimeError: ..."), else from pytest's crash line
    ("tests/test_x.py:12: AssertionError"), else from its last ``E   Type: ...`` line. Signals are
    looked for in the message and the ``E`` lines, not in the test's source that the report shows.
    """
    error_lines = "\n".join(line[1:].strip() for line in text.splitlines() if line.startswith("E "))
    head = re.match(rf"({_EXC_NAME}): ", first_line(message))
    crash = _CRASH_LINE.findall(text)
    e_type = _EXC_LINE.findall(error_lines)
    exception = head.group(1) if head else crash[-1] if crash else e_type[-1] if e_type else None
    sig = find_signal(message + "\n" + (error_lines or text))
    fallback = "Error" if tag == "error" else "Failure"
    return sig or exception or fallback, exception, sig, first_line(message) or first_line(text)


def classify(tag: str, message: str, text: str) -> tuple[str, str | None, str | None, str]:
    """(kind, exception, signal, one-line message) of one junit ``<failure>``/``<error>`` element."""
    message, text = strip_ansi(message), strip_ansi(text)
    if first_line(text or message) == _NBVAL_FIRST_LINE:
        return classify_nbval(text or message)
    return classify_pytest(tag, message, text)


def test_id(classname: str, name: str, target: str) -> str:
    """The cell or test id: ``Cell 13`` for nbval, ``test_fn[param]`` or ``TestClass::test_fn`` for a test.

    junit's classname is the file's path with dots ("tests.test_launch", "chapters.04_ddp.ipynb"),
    then the test's class if any ("tests.test_launch.TestClass"); the file part is dropped.
    """
    file = "." + (Path(target).stem if target.endswith(".py") else Path(target).name)
    dotted = "." + classname
    if dotted.endswith(file):
        return name
    if file + "." in dotted:
        return dotted.split(file + ".", 1)[1].replace(".", "::") + "::" + name
    return f"{classname}::{name}" if classname else name


def parse_junit(xml_text: str, target: str, run: int) -> list[Failure]:
    """The failures (``<failure>`` and ``<error>`` elements) in a pytest junit XML report."""
    failures = []
    for case in ET.fromstring(xml_text).iter("testcase"):
        for element in list(case):
            if element.tag not in ("failure", "error"):
                continue
            kind, exception, sig, message = classify(
                element.tag, element.get("message", ""), element.text or ""
            )
            test = test_id(case.get("classname", ""), case.get("name", ""), target)
            failures.append(Failure(target, run, test, kind, message, exception, sig))
    return failures


# ---------------------------------------------------------------- running pytest


def pytest_command(target: str, junit: Path, extra: list[str]) -> list[str]:
    """The command of one run: pytest on ``target`` (with ``--nbval`` for a notebook), junit to ``junit``.

    ``-v`` makes pytest print each test's id as it starts, so that a run killed at the timeout
    can say which cell or test was running; ``--color=no`` keeps colour codes out of the report.
    """
    nbval = ["--nbval"] if target.endswith(".ipynb") else []
    return [sys.executable, "-m", "pytest", *nbval, target, f"--junitxml={junit}", "-v", "--color=no", *extra]


def process_tree(pid: int) -> list[int]:
    """The pids of ``pid``'s descendants (from /proc; [] where there is none)."""
    children = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children[int(fields[1])].append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the run's process group and every process below it.

    The group is pytest's (started with start_new_session=True); the Jupyter kernel, and the ranks
    it forks, run in a session of their own, so they are found through /proc first.
    """
    below = process_tree(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def last_started(output: str) -> str | None:
    """The cell or test id pytest ``-v`` printed last without a result: the one running when it was killed."""
    ids = re.findall(r"^\S+::(.+?) *$", output, re.M)
    if ids and not re.search(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", ids[-1]):
        return ids[-1]
    return None


def last_words(output: str) -> str:
    """The last non-blank line of a run's output (for a run that ended without a junit report)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def run_failures(
    target: str, run: int, returncode: int | None, junit: str | None, output: str, timeout: float
) -> list[Failure]:
    """The failures of one finished (or killed) run: those in its junit report, and its exit code's."""
    if returncode is None:
        test = last_started(output) or "(run)"
        return [Failure(target, run, test, "timeout", f"still running after {timeout:g} s; killed")]
    failures = []
    if junit:
        try:
            failures = parse_junit(junit, target, run)
        except ET.ParseError as exc:
            failures = [Failure(target, run, "(pytest)", "BadJunitXML", str(exc))]
    if failures or (returncode == 0 and junit):
        return failures
    if returncode < 0:
        name = signal.Signals(-returncode).name
        return [Failure(target, run, "(pytest)", name, f"pytest was killed by {name}", signal=name)]
    what = _PYTEST_EXIT.get(returncode, "no junit report" if not junit else "no failure in its junit report")
    message = f"pytest exit {returncode} ({what}): {last_words(output)}"
    return [Failure(target, run, "(pytest)", f"exit {returncode}", message)]


def run_once(target: str, run: int, timeout: float, env: dict, extra: list[str], log_dir: Path | None):
    """Run pytest once on ``target``; return its RunResult. Kills the whole run at ``timeout`` seconds."""
    with tempfile.TemporaryDirectory(prefix="stress-") as tmp:
        junit, log = Path(tmp) / "junit.xml", Path(tmp) / "output.txt"
        start = time.monotonic()
        with open(log, "w") as out:
            proc = subprocess.Popen(
                pytest_command(target, junit, extra),
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                returncode = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                if proc.returncode is None:  # the timeout, or this tool interrupted (Ctrl-C)
                    kill_tree(proc)
        seconds = time.monotonic() - start
        output = log.read_text(errors="replace")
        report = junit.read_text(errors="replace") if junit.exists() else None
        failures = run_failures(target, run, returncode, report, output, timeout)
        if failures and log_dir:
            save_logs(log_dir, target, run, output, report)
    return RunResult(target, run, round(seconds, 1), returncode, failures)


def save_logs(log_dir: Path, target: str, run: int, output: str, report: str | None) -> None:
    """Keep a failed run's pytest output (and junit report) as ``<log_dir>/<target>.run<k>.txt/.xml``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{target.replace('/', '_')}.run{run}"
    (log_dir / f"{stem}.txt").write_text(output)
    if report:
        (log_dir / f"{stem}.xml").write_text(report)


# ---------------------------------------------------------------- the bound on the failure rate


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (no overflow for large n)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k + 1):
        log_comb = math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
        total += math.exp(log_comb + i * log_p + (n - i) * log_q)
    return min(total, 1.0)


def upper_bound(k: int, n: int, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper-Pearson upper limit on a per-run failure rate, after k failures in n runs.

    The p at which P(X <= k; n, p) = 1 - confidence (the ``confidence`` quantile of
    Beta(k + 1, n - k)), found by bisection; for k = 0 it is 1 - (1 - confidence)**(1/n) (about 3/n).
    """
    if n <= 0:
        raise ValueError(f"upper_bound needs at least one run, got n={n}")
    alpha = 1.0 - confidence
    if k >= n:
        return 1.0
    if k == 0:
        return 1.0 - alpha ** (1.0 / n)
    lo, hi = k / n, 1.0  # binom_cdf falls as p grows; it is above alpha at p = k/n
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if binom_cdf(k, n, mid) > alpha else (lo, mid)
    return (lo + hi) / 2


def bound_text(k: int, n: int) -> str:
    """What k failures in n runs say about the per-run failure rate, in words."""
    bound = upper_bound(k, n)
    if k == 0:
        return f"rate < {bound:.1%} at 95% (0 failures in {n}: 1 - 0.05**(1/{n}))"
    if k == n:
        return f"rate {k / n:.0%} observed (every run failed)"
    return f"rate {k / n:.1%} observed, < {bound:.1%} at 95% (Clopper-Pearson, one-sided)"


# ---------------------------------------------------------------- reporting


def run_line(result: RunResult, runs: int) -> str:
    """One line per run: target, run k/N, passed or failed (with what), seconds."""
    if result.passed:
        status = "passed"
    else:
        what = [f"{f.test} {f.kind}" for f in result.failures[:3]]
        more = f", +{len(result.failures) - 3} more" if len(result.failures) > 3 else ""
        status = f"FAILED ({', '.join(what)}{more})"
    return f"{result.target}  run {result.run}/{runs}  {status}  {result.seconds:.1f} s"


def target_stats(results: list[RunResult]) -> dict:
    """Per target: runs, failed runs, observed rate, 95% upper bound and failures by (test, kind)."""
    stats = {}
    for target in dict.fromkeys(r.target for r in results):
        mine = [r for r in results if r.target == target]
        failed = [r for r in mine if not r.passed]
        by_kind = Counter((f.test, f.kind) for r in failed for f in r.failures)
        stats[target] = {
            "runs": len(mine),
            "failed_runs": len(failed),
            "rate": len(failed) / len(mine),
            "upper_95": upper_bound(len(failed), len(mine)),
            "failures": [
                {
                    "test": test,
                    "kind": kind,
                    "count": count,
                    "runs": [f.run for r in failed for f in r.failures if (f.test, f.kind) == (test, kind)],
                    "message": next(
                        f.message for r in failed for f in r.failures if (f.test, f.kind) == (test, kind)
                    ),
                }
                for (test, kind), count in by_kind.most_common()
            ],
        }
    return stats


def summary(results: list[RunResult]) -> str:
    """The closing table: runs, failed runs and rate bound per target; then failures by cell/test, kind."""
    stats = target_stats(results)
    width = max([len(t) for t in stats] + [6])
    lines = [f"{'target':<{width}}  runs  failed  per-run failure rate"]
    for target, s in stats.items():
        rate = bound_text(s["failed_runs"], s["runs"])
        lines.append(f"{target:<{width}}  {s['runs']:>4}  {s['failed_runs']:>6}  {rate}")
    failing = {t: s for t, s in stats.items() if s["failures"]}
    if failing:
        lines += ["", "failures by cell/test and kind (count, runs, first message):"]
        for target, s in failing.items():
            lines.append(target)
            for f in s["failures"]:
                runs = ", ".join(map(str, f["runs"]))
                lines.append(f"  {f['test']}  {f['kind']}  x{f['count']} (runs {runs})  {f['message'][:160]}")
    return "\n".join(lines)


def write_json(path: Path, results: list[RunResult], settings: dict) -> None:
    """Write the settings, per-target statistics and every run (with its failures) as JSON."""
    data = {
        "settings": settings,
        "targets": target_stats(results),
        "runs": [{**asdict(r), "passed": r.passed} for r in results],
    }
    path.write_text(json.dumps(data, indent=2) + "\n")


# ---------------------------------------------------------------- command line


def parse_env(pairs: list[str]) -> dict:
    """``["KEY=VALUE", ...]`` as a dict; a pair without ``=`` is an error."""
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--env takes KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


def relative_target(target: str) -> str:
    """``target`` as pytest, started at the repository root, should be given it (relative if inside)."""
    path = Path(target).resolve()
    if not path.exists():
        raise SystemExit(f"no such file: {target}")
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        description="Run notebooks or test files N times in a row; report failures by file, cell and signal.",
        epilog="Example: python tools/stress.py --runs 30 chapters/04_ddp.ipynb tests/test_launch.py",
    )
    parser.add_argument("targets", nargs="+", help="chapter notebooks (.ipynb) or test files (.py)")
    parser.add_argument("--runs", type=int, default=10, help="runs per target (default 10)")
    parser.add_argument(
        "--timeout", type=float, default=900, help="seconds per run before it is killed (900)"
    )
    parser.add_argument("--stop-on-failure", action="store_true", help="stop at the first failed run")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set in the runs' environment (repeatable)",
    )
    parser.add_argument(
        "--pytest-args", default="", help='extra pytest arguments, one string: "-k allreduce -x"'
    )
    parser.add_argument("--json", type=Path, help="write the results to this file")
    parser.add_argument(
        "--log-dir", type=Path, help="keep each failed run's pytest output and junit report here"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def run_all(
    targets: list[str], args: argparse.Namespace, env: dict, extra: list[str], results: list[RunResult]
) -> None:
    """Run each target ``args.runs`` times in a row, appending to ``results`` and printing a line per run."""
    for target in targets:
        for run in range(1, args.runs + 1):
            result = run_once(target, run, args.timeout, env, extra, args.log_dir)
            results.append(result)
            print(run_line(result, args.runs), flush=True)
            if args.stop_on_failure and not result.passed:
                print("stopped at the first failure (--stop-on-failure)")
                return


def main(argv: list[str] | None = None) -> int:
    """Run every target ``--runs`` times, print a line per run and the summary; 0 if all passed, else 1."""
    args = parse_args(argv)
    targets = [relative_target(t) for t in args.targets]
    env = {**os.environ, **parse_env(args.env)}
    results: list[RunResult] = []
    interrupted = False
    try:
        run_all(targets, args, env, shlex.split(args.pytest_args), results)
    except KeyboardInterrupt:  # the run in progress was killed; report those that finished
        interrupted = True
        print("\ninterrupted; the run in progress is not counted")
    if results:
        print()
        print(summary(results))
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        write_json(args.json, results, {**settings, "targets": targets, "interrupted": interrupted})
    return 0 if results and all(r.passed for r in results) and not interrupted else 1


if __name__ == "__main__":
    sys.exit(main())
