"""Sources of the numbers written in solutions/chapter06.ipynb (see tests/figure_sources.py).

``Computed`` and ``Exempt`` are provided when the file is executed."""


def _one_f_one_b(**costs):
    from course_utils.pipeline import Costs, one_f_one_b, simulate

    return simulate(one_f_one_b(4, 8), Costs(**costs))


def _skewed_idle(device):
    from course_utils.pipeline import Costs, one_f_one_b, simulate

    costs = Costs(F=1, B=1, W=1)
    return simulate(one_f_one_b(4, 8), [costs] * 3 + [Costs(F=2, B=2, W=2)]).idle(device)


def _interleaved_formula(p):
    from course_utils.pipeline import interleaved_bubble_fraction

    return interleaved_bubble_fraction(p, 8, 2)


def _messages(p, v):
    """Sends per step of a lowered schedule (m = 8): 1F1B's (v = 1) or interleaved 1F1B's."""
    from course_utils.pipeline import interleaved_1f1b, lower, one_f_one_b

    s = one_f_one_b(p, 8) if v == 1 else interleaved_1f1b(p, 8, v)
    return sum(op.kind == "send" for ops in lower(s) for op in ops)


def _gpipe_bubble(p):
    from course_utils.pipeline import gpipe_bubble_fraction

    return gpipe_bubble_fraction(p, 8)


def _message_ms(network):
    """One [128, 4096] float32 activation between two modeled H100s on ``network`` (appendix 06a)."""
    from course_utils import Cluster
    from course_utils.pipeline import MLPConfig
    from course_utils.pipeline.modeled import message_ms

    return message_ms(Cluster("h100", network), MLPConfig(width=4096, layers=8, batch=1024), 8)


FIGURES = {
    1: {
        "33": Computed(lambda: _one_f_one_b(F=1, B=1, W=1).makespan),
        "41": Computed(lambda: _one_f_one_b(F=1, B=1, W=1, comm=0.5).makespan),
    },
    2: {"33": Computed(lambda: _skewed_idle(0))},
    3: {"24": Computed(lambda: 8 * (1 + 1 + 1))},  # m (F + B + W) busy units per device
    4: {
        "0.898": InChapter("p = 4: step, interleaved / 1F1B"),  # noqa: F821  the solution's modeled runs
        "0.969": InChapter("p = 2: step, interleaved / 1F1B"),  # noqa: F821
        "8.175": InChapter("p = 4, Interleaved 1F1B"),  # noqa: F821
        "9.099": InChapter("p = 4, 1F1B"),  # noqa: F821
        "112": Computed(lambda: _messages(4, 2)),  # noqa: F821
        "48": Computed(lambda: _messages(4, 1)),  # noqa: F821
        "0.2812": InChapter("p = 4, Interleaved 1F1B"),  # noqa: F821
        "0.1579": Computed(lambda: _interleaved_formula(4)),  # noqa: F821
        "0.3542": InChapter("p = 4, 1F1B"),  # noqa: F821
        "0.2727": Computed(lambda: _gpipe_bubble(4)),  # noqa: F821
        "0.1111": Computed(lambda: _gpipe_bubble(2)),  # noqa: F821
        "0.0588": Computed(lambda: _interleaved_formula(2)),  # noqa: F821
        "0.0519": Computed(lambda: _message_ms("infiniband")),  # noqa: F821
        "0.1923": InChapter("p = 4, Interleaved 1F1B"),  # noqa: F821  its replay with free messages
        "0.3034": InChapter("p = 4, 1F1B"),  # noqa: F821
        "1.3722": Computed(lambda: _message_ms("ethernet")),  # noqa: F821
    },
    5: {action: Exempt("an action's (stage, micro-batch), as in B(1,3)") for action in ("1,3", "1,0", "1,1")},
}
