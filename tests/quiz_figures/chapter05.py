"""Sources of the numbers in quiz 05's answers (see tests/test_quiz_figures.py)."""

from functools import cache

MB = 1e6


@cache
def _part_and_batch():
    """Question 4: a part of 4 blocks Linear(1024, 1024) + ReLU and a batch of 512 rows."""
    import torch

    torch.manual_seed(0)
    part = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU()) for _ in range(4)]
    )
    return part, torch.randn(512, 1024)


def _saved_mb() -> float:
    from course_utils.model_parallel.activation_memory import saved_for_backward

    return saved_for_backward(*_part_and_batch()).activation_bytes / MB


def _outputs_mb() -> float:
    from course_utils.model_parallel.activation_memory import layer_output_bytes

    return layer_output_bytes(*_part_and_batch()) / MB


def _a_split_without_micro_batches_idles_three_quarters() -> bool:
    """Question 2: 4 parts, one batch: every device idles 3/4 of the step."""
    from course_utils.pipeline import gpipe, simulate

    t = simulate(gpipe(4, 1))
    return t.bubble_fraction == 0.75 and all(t.idle(d) / t.makespan == 0.75 for d in range(4))


def _sequential_moves_nothing() -> bool:
    """Question 3: the chapter runs the recipe, layers on two devices in one nn.Sequential (meta
    stands in for a second GPU), and its stored output shows the mismatch error (nbval reruns it;
    running it here would cost seconds of importing meta kernels)."""
    from figure_sources import chapter_says

    return chapter_says(5, "RuntimeError: Tensor on device", "is not on the expected device")


def _fsdp_mlp():
    """Question 7: the chapter's FSDP run, make_model(width=256, layers=4) on 2 ranks: the
    parameters, and the bytes of Adam's step counters (4 per parameter tensor, not sharded)."""
    import torch

    block = [torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()) for _ in range(4)]
    mlp = torch.nn.Sequential(*block)
    return sum(p.numel() for p in mlp.parameters()), 4 * len(list(mlp.parameters()))


def _fsdp_bytes_per_rank() -> float:
    from course_utils.model_parallel.training_memory import PRECISIONS, bytes_per_parameter

    n, counters = _fsdp_mlp()
    return bytes_per_parameter(PRECISIONS[0], 2, stage=3) * n + counters


def _fully_shard_splits_all_16_bytes() -> bool:
    """Question 7: fp32 Adam keeps 16 bytes per parameter, and stage 3 (FSDP) splits all of them
    (stages 1 and 2 are the wrong options' 8 + 8 / W and 4 + 12 / W)."""
    from course_utils.model_parallel.training_memory import PRECISIONS, bytes_per_parameter

    fp32, w = PRECISIONS[0], 8
    per_stage = [bytes_per_parameter(fp32, w, stage) for stage in range(4)]
    return per_stage == [16, 8 + 8 / w, 4 + 12 / w, 16 / w]


FIGURES = {
    4: {
        "2.1": Computed(lambda: _part_and_batch()[1].nbytes / MB),
        "10.5": Computed(_saved_mb),
        "16.8": Computed(_outputs_mb),  # A: every layer's output
    },
    7: {
        "263,168": Computed(lambda: _fsdp_mlp()[0]),
        "2,105,376": Computed(_fsdp_bytes_per_rank),  # the chapter's stored "2105376 bytes per rank"
        "32": Computed(lambda: _fsdp_mlp()[1]),
    },
}

CLAIMS = {
    2: (Claim("idle (p-1)/p = 3/4", _a_split_without_micro_batches_idles_three_quarters),),
    3: (Claim("The last layer raises a device-mismatch error", _sequential_moves_nothing),),
    7: (Claim("all 16 bytes are split", _fully_shard_splits_all_16_bytes),),
}
