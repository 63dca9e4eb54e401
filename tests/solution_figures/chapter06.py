"""Sources of the numbers written in solutions/chapter06.ipynb (see tests/figure_sources.py).

``Computed`` and ``Exempt`` are provided when the file is executed."""


def _one_f_one_b(**costs):
    from course_utils.pipeline import Costs, one_f_one_b, simulate

    return simulate(one_f_one_b(4, 8), Costs(**costs))


def _skewed_idle(device):
    from course_utils.pipeline import Costs, one_f_one_b, simulate

    costs = Costs(F=1, B=1, W=1)
    return simulate(one_f_one_b(4, 8), [costs] * 3 + [Costs(F=2, B=2, W=2)]).idle(device)


def _interleaved_formula():
    from course_utils.pipeline import interleaved_bubble_ratio

    r = interleaved_bubble_ratio(2, 8, 2)
    return r / (1 + r)


def _messages(schedule):
    """Sends per step of a lowered schedule (p = 2, m = 8): 1F1B's or interleaved 1F1B's (v = 2)."""
    from course_utils.pipeline import interleaved_1f1b, lower, one_f_one_b

    s = one_f_one_b(2, 8) if schedule == "1f1b" else interleaved_1f1b(2, 8, 2)
    return sum(op.kind == "send" for ops in lower(s) for op in ops)


def _gpipe_bubble():
    from course_utils.pipeline import gpipe_bubble_fraction

    return gpipe_bubble_fraction(2, 8)


FIGURES = {
    1: {
        "33": Computed(lambda: _one_f_one_b(F=1, B=1, W=1).makespan),
        "41": Computed(lambda: _one_f_one_b(F=1, B=1, W=1, comm=0.5).makespan),
    },
    2: {"33": Computed(lambda: _skewed_idle(0))},
    3: {"24": Computed(lambda: 8 * (1 + 1 + 1))},  # m (F + B + W) busy units per device
    4: {
        "0.111": Computed(_gpipe_bubble),  # 1F1B's bubble by the formula, p = 2, m = 8
        "0.059": Computed(_interleaved_formula),
        "48": Computed(lambda: _messages("interleaved")),
        "16": Computed(lambda: _messages("1f1b")),
    },
    5: {action: Exempt("an action's (stage, micro-batch), as in B(1,3)") for action in ("1,3", "1,0", "1,1")},
}
