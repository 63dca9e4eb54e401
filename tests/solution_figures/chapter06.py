"""Sources of the numbers written in solutions/chapter06.ipynb (see tests/figure_sources.py).

``Computed`` and ``Exempt`` are provided when the file is executed."""


def _one_f_one_b(**costs):
    from course_utils.pipeline import Costs, one_f_one_b, simulate

    return simulate(one_f_one_b(4, 8), Costs(**costs))


def _skewed_idle(device):
    from course_utils.pipeline import Costs, one_f_one_b, simulate

    costs = Costs(F=1, B=1, W=1)
    return simulate(one_f_one_b(4, 8), [costs] * 3 + [Costs(F=2, B=2, W=2)]).idle(device)


FIGURES = {
    1: {
        "33": Computed(lambda: _one_f_one_b(F=1, B=1, W=1).makespan),
        "41": Computed(lambda: _one_f_one_b(F=1, B=1, W=1, comm=0.5).makespan),
    },
    2: {"33": Computed(lambda: _skewed_idle(0))},
    3: {"24": Computed(lambda: 8 * (1 + 1 + 1))},  # m (F + B + W) busy units per device
    5: {action: Exempt("an action's (stage, micro-batch), as in B(1,3)") for action in ("1,3", "1,0", "1,1")},
}
