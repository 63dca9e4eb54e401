"""Sources of the numbers in quiz 06's answers (see tests/test_quiz_figures.py)."""


def _messages(schedule) -> int:
    """Messages one step sends: the send operations of the lowered schedule, over all devices."""
    from course_utils.pipeline.lowering import lower

    return sum(op.kind == "send" for ops in lower(schedule) for op in ops)


def _interleaved(kind: str) -> float:
    """Question 3: p = 4, m = 12, v = 2."""
    from course_utils.pipeline import interleaved_1f1b, interleaved_bubble_fraction, interleaved_bubble_ratio

    if kind == "messages":
        return _messages(interleaved_1f1b(4, 12, 2))
    return (interleaved_bubble_ratio if kind == "ratio" else interleaved_bubble_fraction)(4, 12, 2)


def _one_f_one_b_messages() -> int:
    from course_utils.pipeline import one_f_one_b

    return _messages(one_f_one_b(4, 12))


def _forward_phase_ms(m: int) -> float:
    """Question 8: 2-stage GPipe, 8 ms of forward per stage split over m, 0.5 ms fixed per action."""
    from course_utils.pipeline import Costs, gpipe, simulate

    return simulate(gpipe(2, m), [Costs(F=8 / m + 0.5, B=0, W=0)] * 2).makespan


def _gpipe_fraction() -> float:
    """Question 3: plain GPipe's (and 1F1B's) bubble fraction for p = 4, m = 12, the 3/15 it names."""
    from course_utils.pipeline import gpipe_bubble_fraction

    return gpipe_bubble_fraction(4, 12)


def _peak_activations() -> bool:
    """Question 2: device 0's peak of live micro-batches, 4 stages and 8 micro-batches."""
    from course_utils.pipeline import gpipe, one_f_one_b, simulate

    return [simulate(s).peak_activations()[0] for s in (gpipe(4, 8), one_f_one_b(4, 8))] == [8, 4]


def _idle_zb_h1_and_1f1b() -> bool:
    """Question 5: F = B = W = 1, p = 4: device 0 idles 3 under ZB-H1 and 9 under 1F1B."""
    from course_utils.pipeline import one_f_one_b, simulate, zero_bubble_h1

    return simulate(zero_bubble_h1(4, 8)).idle(0) == 3 and simulate(one_f_one_b(4, 8)).idle(0) == 9


def _weight_gradients_wait() -> bool:
    """Question 4: F = B = W = 1, p = 4: ZB-H1 idles (p-1)(F+B-W) per device where 1F1B idles
    (p-1)(F+B+W); every device holds up to p micro-batches under ZB-H1, up to 2p-1 under ZB-H2."""
    from course_utils.pipeline import (
        Costs,
        one_f_one_b,
        simulate,
        zb_h1_bubble_time,
        zero_bubble_h1,
        zero_bubble_h2,
    )

    costs = Costs(F=1, B=1, W=1)
    h1 = simulate(zero_bubble_h1(4, 8), costs)
    plain = simulate(one_f_one_b(4, 8), costs)
    return (
        all(h1.idle(d) == zb_h1_bubble_time(4, costs) == (4 - 1) * (1 + 1 - 1) for d in range(4))
        and all(plain.idle(d) == (4 - 1) * (1 + 1 + 1) for d in range(4))
        and h1.peak_activations() == [4] * 4
        and max(simulate(zero_bubble_h2(4, 8), costs).peak_activations()) == 2 * 4 - 1
    )


def _recompute_peaks() -> bool:
    """Question 6: the chapter measures a stage of 4 blocks under GPipe's order over 8 micro-batches
    with saved-tensor hooks (recompute.stage_step; nbval reruns it): 40 a without, 12 a with
    recomputation. Running it here would cost seconds of importing torch.utils.checkpoint's helpers."""
    from figure_sources import chapter_says

    return chapter_says(6, "without recomputation: peak saved activations", "= 40 a") and chapter_says(
        6, "with    recomputation: peak saved activations", "= 12 a"
    )


FIGURES = {
    3: {
        "24": Computed(lambda: 3 / _interleaved("ratio")),
        "15": Computed(lambda: 3 / _gpipe_fraction()),  # 3/15: m + p - 1 stage-times
        "27": Computed(lambda: 3 / _interleaved("fraction")),
        "168": Computed(lambda: _interleaved("messages")),
        "72": Computed(_one_f_one_b_messages),
    },
    8: {
        "13.5": Computed(lambda: _forward_phase_ms(2)),  # and m = 8
        "12.5": Computed(lambda: _forward_phase_ms(4)),
        "17": Computed(lambda: _forward_phase_ms(16)),
    },
}

CLAIMS = {
    2: (Claim("8 under GPipe, 4 under 1F1B", _peak_activations),),
    4: (Claim("up to `2p-1`", _weight_gradients_wait),),
    5: (Claim("3 and 9", _idle_zb_h1_and_1f1b),),
    6: (Claim("From 40a to 12a", _recompute_peaks),),
    8: (
        Claim("13.5 ms for m = 2, 12.5 for 4, 13.5 for 8", lambda: _forward_phase_ms(8) == 13.5),
        Claim("B. 4", lambda: min((2, 4, 8, 16), key=_forward_phase_ms) == 4),
    ),
}
