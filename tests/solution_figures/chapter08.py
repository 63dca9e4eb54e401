"""Sources of the numbers written in solutions/chapter08.ipynb (see tests/figure_sources.py)."""

YEAR = 365 * 24 * 3600
SAVE = 60  # seconds per checkpoint (exercise 5)
BEST_MTBF = 2 * SAVE / 0.1**2  # sqrt(2 C / M) = 0.1
KILLED_BEFORE, EVERY = 14, 5  # exercise 1: the kill and checkpoint interval of the chapter's section 2
LAST_CHECKPOINT = (KILLED_BEFORE - 1) // EVERY * EVERY
EPOCH, STEPS_PER_EPOCH, STOPPED_AFTER = 4096, 32, 20  # the chapter's section 4 run
LEFT = EPOCH - STOPPED_AFTER * EPOCH // STEPS_PER_EPOCH  # samples left when 3 ranks resume


def _exercise6(what: str) -> float:
    """A time in ms the solution's exercise 6 printed (its modeled run): the number before ``what``."""
    import json
    import re
    from pathlib import Path

    import course_utils

    notebook = Path(course_utils.__file__).resolve().parents[1] / "solutions" / "chapter08.ipynb"
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        for out in cell.get("outputs", []):
            for line in "".join(out.get("text", "")).splitlines():
                found = re.search(rf"([\d.]+) ms{re.escape(what)}", line)
                if found and ("checkpoint 2" in line or "checkpoints after the first" in line):
                    return float(found.group(1))
    return float("nan")


def _young_daly_minutes() -> float:
    from course_utils.checkpoint import young_daly_interval

    return young_daly_interval(SAVE, BEST_MTBF) / 60


FIGURES = {
    1: {
        "10": Computed(lambda: LAST_CHECKPOINT),  # noqa: F821
        "11": Computed(lambda: LAST_CHECKPOINT + 1),  # noqa: F821
        "12": Computed(lambda: LAST_CHECKPOINT + 2),  # noqa: F821
        "13": Computed(lambda: KILLED_BEFORE - 1),  # noqa: F821
    },
    5: {
        "13,140": Computed(lambda: 5 * YEAR / BEST_MTBF),  # noqa: F821
        "12,000": Computed(lambda: BEST_MTBF),  # noqa: F821
        "3.3": Computed(lambda: BEST_MTBF / 3600),  # noqa: F821
        "20": Computed(lambda: _young_daly_minutes()),  # noqa: F821
        "0.1": Computed(lambda: 2 * (SAVE / (2 * BEST_MTBF)) ** 0.5),  # noqa: F821
        "200": Computed(lambda: BEST_MTBF / SAVE),  # noqa: F821
    },
    6: {
        "4.492": Computed(lambda: _exercise6(" = staging")),  # noqa: F821
        "0.800": InChapter("dcp.async_save  0.800 ms"),  # noqa: F821
        "3.692": Computed(lambda: _exercise6("; one write")),  # noqa: F821
        "4.096": InChapter("dcp.save        4.096 ms"),  # noqa: F821
        "0.404": Computed(lambda: _exercise6(" of training")),  # noqa: F821
        "51": Computed(lambda: 200_000 * 64 * 4 * 2 / 2 / 1e6),  # noqa: F821  a rank's half: table + Adagrad sums
        "12.5": InChapter("12.5 GB/s of writes per GPU"),  # noqa: F821
        "40": InChapter("40 steps of training"),  # noqa: F821
    },
    7: {
        "128": Computed(lambda: EPOCH // STEPS_PER_EPOCH),  # noqa: F821
        "126": Computed(lambda: EPOCH // STEPS_PER_EPOCH // 3 * 3),  # noqa: F821
        "42": Computed(lambda: 126 / 3),  # noqa: F821
        "1,536": Computed(lambda: LEFT),  # noqa: F821
        "512": Computed(lambda: LEFT / 3),  # noqa: F821
        "12": Computed(lambda: LEFT // 3 // 42),  # noqa: F821
        "24": Computed(lambda: LEFT - 3 * (LEFT // 3 // 42) * 42),  # noqa: F821
        "504": Computed(lambda: 12 * 42),  # noqa: F821
    },
}
