"""The explorers' update functions against the closed forms they draw, and the sliders in front of them."""

from __future__ import annotations

import math

import matplotlib
import pytest

from course_utils.collectives.bandwidth import AlphaBeta
from course_utils.explorers.allreduce import allreduce_seconds, crossover_bytes, draw_allreduce
from course_utils.explorers.pipeline import SCHEDULE_TITLES, draw_pipeline, pipeline_view
from course_utils.explorers.sharding import GIB, draw_sharding, sharding_view
from course_utils.notebook import widgets
from course_utils.pipeline.simulate import gpipe_bubble_fraction
from course_utils.sharding.volume import formula

pytestmark = [
    pytest.mark.chapter(2, 6, 7),
    pytest.mark.usefixtures("agg_backend"),  # tests/conftest.py
]


# --- pipeline -------------------------------------------------------------------------------


@pytest.mark.parametrize("title", list(SCHEDULE_TITLES))
def test_pipeline_view_matches_the_formulas_on_uniform_stages(title):
    checked = 0
    for p in (2, 3, 4, 5):
        for m in range(p, 3 * p + 1):
            for v in (1, 2, 3):
                try:
                    view = pipeline_view(title, p, m, v, F=1.0, B=2.0, W=1.0)
                except ValueError:
                    continue  # e.g. interleaved with m not a multiple of p
                assert view.bubble == pytest.approx(view.bubble_formula, abs=1e-9), (p, m, v)
                assert view.peak == pytest.approx(view.peak_formula), (p, m, v)
                checked += 1
    assert checked >= 10


def test_pipeline_view_known_values():
    assert pipeline_view("GPipe", 4, 8).bubble == pytest.approx(gpipe_bubble_fraction(4, 8)) == 3 / 11
    # interleaving: device 0 holds (v-1)p + 2p - 1 = 11 half-stage activations = 5.5 stages, 1F1B 4
    assert pipeline_view("Interleaved 1F1B", 4, 8, 2).peak[0] == 5.5
    assert pipeline_view("1F1B", 4, 8).peak == [4, 3, 2, 1]
    # a per-message cost lengthens the simulated bubble beyond the formula (which ignores it)
    slow = pipeline_view("1F1B", 4, 8, comm=0.5)
    assert slow.bubble > slow.bubble_formula


def test_pipeline_view_errors_and_drawing():
    with pytest.raises(ValueError, match="multiple of p"):
        pipeline_view("Interleaved 1F1B", 4, 6, 2)
    assert pipeline_view("ZB-H1", 4, 8, W=3.0).bubble_formula is None  # the formula needs W <= F, B
    for knobs in ({"schedule": "ZB-H1"}, {"schedule": "Interleaved 1F1B", "m": 6}):
        fig = draw_pipeline(**knobs)  # a combination that cannot be built draws its reason
        assert fig.axes
        matplotlib.pyplot.close(fig)


# --- all-reduce -----------------------------------------------------------------------------


def test_ring_is_chapter_02s_alpha_beta_model():
    model = AlphaBeta(alpha=2e-4, beta=1e9, world_size=4)  # beta: bytes per second
    for n in (1e3, 1e6, 1e9):
        assert allreduce_seconds("ring", n, 4, 2e-4, 1e9) == pytest.approx(model.seconds(n))


def test_tree_and_naive_closed_forms_and_crossover():
    assert allreduce_seconds("tree", 1e6, 8, 1e-5, 1e9) == pytest.approx(2 * 3 * (1e-5 + 1e-3))
    assert allreduce_seconds("naive", 1e6, 8, 1e-5, 1e9) == pytest.approx(2 * 7 * (1e-5 + 1e-3))
    assert allreduce_seconds("ring", 1e6, 1, 1e-5, 1e9) == 0.0
    n = crossover_bytes(16, 1e-4, 1e9)
    ring, tree = (allreduce_seconds(a, n, 16, 1e-4, 1e9) for a in ("ring", "tree"))
    assert ring == pytest.approx(tree)
    assert allreduce_seconds("ring", 2 * n, 16, 1e-4, 1e9) < allreduce_seconds("tree", 2 * n, 16, 1e-4, 1e9)
    assert allreduce_seconds("ring", n / 2, 16, 1e-4, 1e9) > allreduce_seconds("tree", n / 2, 16, 1e-4, 1e9)
    assert crossover_bytes(2, 1e-4, 1e9) == 0  # two ranks: the ring is never slower than the tree
    assert math.isinf(crossover_bytes(1, 1e-4, 1e9))  # one rank: nothing to compare
    with pytest.raises(ValueError, match="unknown algorithm"):
        allreduce_seconds("butterfly", 1, 2, 0, 1)
    with pytest.raises(ValueError, match="beta > 0"):
        allreduce_seconds("ring", 1, 2, 0, 0)
    fig = draw_allreduce(modeled=[(2**20, 1e-4), (2**24, 1e-3)])
    assert len(fig.axes[0].lines) >= 7
    matplotlib.pyplot.close(fig)


def three_ways_to_all_reduce(nbytes):
    """On a modeled cluster: the ring (dist.all_reduce), the tree (reduce + broadcast) and the naive
    one (gather + scatter of whole tensors, no additions): each one's collectives, as
    ``{name: [modeled ns of each collective]}``, from this rank's timeline."""
    import torch
    import torch.distributed as dist

    from course_utils.runtime.cluster import timeline

    w, me = dist.get_world_size(), dist.get_rank()
    t = torch.zeros(nbytes // 4)  # real tensors: gloo's gather refuses meta ones on the other ranks
    parts = [torch.zeros_like(t) for _ in range(w)] if me == 0 else None
    steps = {
        "ring": lambda: dist.all_reduce(t),
        "tree": lambda: (dist.reduce(t, dst=0), dist.broadcast(t, src=0)),
        "naive": lambda: (dist.gather(t, parts, dst=0), dist.scatter(t, parts, src=0)),
    }
    took = {}
    for name, step in steps.items():
        dist.barrier()
        before = len(timeline().on(me, "collectives"))
        step()
        took[name] = [s.duration_ns for s in timeline().on(me, "collectives")[before:]]
    return took


@pytest.mark.launches
def test_the_explorers_lines_are_the_clusters_prices():
    from course_utils import launch
    from course_utils.runtime.cluster import Cluster

    cluster = Cluster("h100", "nvlink")
    alpha, beta = cluster.network.link([0, 1, 2, 3])
    for nbytes in (1 << 10, 1 << 20):
        for took in launch(three_ways_to_all_reduce, nbytes, world_size=4, cluster=cluster, timeout=120):
            assert [len(took[name]) for name in ("ring", "tree", "naive")] == [1, 2, 2]
            for name, durations in took.items():
                expected = allreduce_seconds(name, nbytes, 4, alpha, beta) * 1e9
                assert sum(durations) == pytest.approx(expected, abs=1), name  # whole ns per collective


# --- sharding -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["table_wise", "row_wise", "column_wise"])
def test_sharding_view_is_the_volume_formula_and_the_plan(kind):
    view = sharding_view(kind, tables=8, rows=2**16, dim=64, batch=512, world_size=4, budget_gib=1.0)
    routed = [[512 * 8 / 4] * 4] * 4 if kind == "row_wise" else None
    total = formula(kind, 512, 8, 64, 4, routed=routed)["total"]
    assert view.sent_per_rank["total"] * 4 == pytest.approx(total)
    # every value of every table is held once, x4 for weight, gradient and Adam's two moments
    assert sum(view.memory_per_rank) == 8 * 2**16 * 64 * 4 * 4
    assert view.fits == (max(view.memory_per_rank) <= GIB)


def test_sharding_view_budget_and_drawing():
    tight = sharding_view("table_wise", tables=3, rows=2**20, dim=64, world_size=4, budget_gib=0.75)
    assert not tight.fits and max(tight.memory_per_rank) == 2**20 * 64 * 4 * 4
    assert sharding_view("row_wise", tables=3, rows=2**20, dim=64, world_size=4, budget_gib=0.75).fits
    fig = draw_sharding(kind="row_wise", world_size=2)
    assert len(fig.axes) == 2
    matplotlib.pyplot.close(fig)


# --- the sliders ----------------------------------------------------------------------------


def test_controls_from_short_forms():
    c = widgets.controls_from(
        {"m": (1, 32, 1, 8), "x": (0.0, 1.0, 0.1, 0.5), "n": (2, 2**10, 2**4), "s": ["a", "b"]}
    )
    assert c["m"].integer and not c["x"].integer and c["n"].value == 16 and c["s"].value == "a"
    assert widgets.defaults({"m": (1, 32, 1, 8), "s": ["a", "b"]}) == {"m": 8, "s": "a"}
    for bad in ((1, 2), (0, 10, 1, 11), (3, 16, 4)):
        with pytest.raises(ValueError):
            widgets.controls_from({"bad": bad})


def test_moving_a_slider_redraws_with_the_new_value():
    pytest.importorskip("ipywidgets")
    calls = []

    def draw(**knobs):
        calls.append(knobs)
        fig = matplotlib.pyplot.figure()
        return fig

    box, sliders, output = widgets.live(
        draw, {"m": (1, 32, 1, 8), "n": (2, 2**10, 2**4), "s": ["a", "b"]}, {"k": 1}
    )
    assert not calls  # nothing drawn until a knob moves
    sliders["m"].value = 12
    sliders["n"].value = 8  # the slider is log2: 2**8
    sliders["s"].value = "b"
    assert calls[-1] == {"m": 12, "n": 256, "s": "b", "k": 1} and len(calls) == 3
    assert output in box.children
