"""Sources of the numbers in solutions/chapter04.ipynb's prose (see tests/figure_sources.py)."""


def _gradient_bytes() -> int:
    """The float32 gradients of the dense part of MLPerf's DLRM (chapter 04, section 5b)."""
    from course_utils.ddp.overlap import MLPERF_DLRM

    return sum(p.numel() * 4 for p in MLPERF_DLRM.build().parameters())


def _t4_pair():
    from course_utils.runtime.cluster import NETWORKS

    return NETWORKS["pcie-gen3"]


def _bytes_us() -> float:
    """A two-rank ring all-reduce's bytes term on the T4 pair, ``2 n / (2 beta)``, in us."""
    return 2 * _gradient_bytes() / (2 * _t4_pair().bandwidth_Bps) * 1e6


def _latency_us() -> float:
    """A two-rank ring all-reduce's latency, ``2 alpha``, in us."""
    return 2 * _t4_pair().latency_s * 1e6


FIGURES = {
    1: {"20": InChapter("largest weight difference after")},  # noqa: F821  section 4's 20 SGD steps
    2: {"6": Exempt("a section number of appendix 04a (section 6, Join)")},  # noqa: F821
    3: {
        "593.1": Computed(_bytes_us),  # noqa: F821
        "20": Computed(_latency_us),  # noqa: F821
        "20.0": Computed(_latency_us),  # noqa: F821
        "840.0": Computed(lambda: 42 * _latency_us()),  # noqa: F821  naive: one all-reduce per gradient
        "59": Computed(lambda: 100 * 42 * _latency_us() / (42 * _latency_us() + _bytes_us())),  # noqa: F821
        "9,488,900": Computed(_gradient_bytes),  # noqa: F821
        "16": Computed(lambda: _t4_pair().bandwidth_Bps / 1e9),  # noqa: F821
    },
    4: {"25": Exempt("torch DDP's default bucket_cap_mb, a documented constant")},  # noqa: F821
    5: {
        "30": Computed(lambda: -(-60_000 // 2048)),  # noqa: F821  steps per epoch at w = 8
        "235": Computed(lambda: -(-60_000 // 256)),  # noqa: F821  steps per epoch on one rank
        "60": Computed(lambda: 2 * -(-60_000 // 2048)),  # noqa: F821  2 epochs at w = 8
        "470": Computed(lambda: 2 * -(-60_000 // 256)),  # noqa: F821  2 epochs on one rank
    },
}
