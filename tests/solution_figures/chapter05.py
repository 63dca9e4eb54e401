"""Sources of the numbers written in solutions/chapter05.ipynb (see tests/figure_sources.py)."""


def _crossover(sizes, part):
    """Smallest batch at which part ``part``'s saved activations exceed its weights (bytes, exact)."""
    import torch

    from course_utils import devices
    from course_utils.model_parallel import VerticalSplit
    from course_utils.model_parallel.activation_memory import saved_for_backward

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU()) for _ in range(8)]
    )
    split = VerticalSplit(model, devices(2, quiet=True), sizes=sizes)
    block = split.parts[part]
    per_row = saved_for_backward(block, torch.randn(1, 1024)).activation_bytes
    weights = sum(p.nbytes for p in block.parameters())
    return weights / per_row


def _activation_bytes_per_row(part_blocks):
    import torch

    from course_utils.model_parallel.activation_memory import saved_for_backward

    block = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU()) for _ in range(part_blocks)]
    )
    return saved_for_backward(block, torch.randn(1, 1024)).activation_bytes


def _table_mb(cardinalities, balance):
    from course_utils import devices
    from course_utils.model_parallel import place_embedding_tables
    from course_utils.workload.models import DLRM

    dlrm = DLRM(cardinalities, embedding_dim=16, seed=0)
    where = place_embedding_tables(dlrm, devices(2, quiet=True), balance=balance)
    held = [0, 0]
    for table, device in enumerate(where):
        held[device] += dlrm.embeddings[table].weight.nbytes
    return [b / 1e6 for b in held]


def _saved_mb(activation):
    import torch

    from course_utils.model_parallel.activation_memory import saved_for_backward

    torch.manual_seed(0)
    part = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(1024, 1024), activation()) for _ in range(4)]
    )
    return saved_for_backward(part, torch.randn(512, 1024)).activation_bytes / 1e6


CHAPTER = [200_000, 50_000, 120_000, 30_000, 80_000, 10_000]
TWICE = [200_000, 100_000, 200_000, 100_000]

FIGURES = {
    1: {
        "74.5": InChapter("idle share per GPU"),  # noqa: F821  the solution's modeled 4-GPU step
        "79.7": InChapter("idle share per GPU"),  # noqa: F821
        "76.8": InChapter("idle share per GPU"),  # noqa: F821
        "75": Computed(lambda: 100 * 3 / 4),  # noqa: F821  (p-1)/p for p = 4, in %
        "2.1": Computed(lambda: 512 * 1024 * 4 / 1e6),  # noqa: F821  one [512, 1024] float32 activation, MB
        "0.2107": InChapter("busy per GPU"),  # noqa: F821
        "0.1679": InChapter("busy per GPU"),  # noqa: F821
    },
    2: {
        "820": Computed(lambda: _crossover([4, 4], 0)),  # noqa: F821 (injected by figure_sources)
        "821": Computed(lambda: int(_crossover([4, 4], 0)) + 1),  # noqa: F821
        "769": Computed(lambda: int(_crossover([3, 5], 0)) + 1),  # noqa: F821
        "855": Computed(lambda: int(_crossover([3, 5], 1)) + 1),  # noqa: F821
        "768.75": Computed(lambda: _crossover([3, 5], 0)),  # noqa: F821
        "854.2": Computed(lambda: _crossover([3, 5], 1)),  # noqa: F821
        "1024": Exempt("the width of the chapter's layers"),  # noqa: F821
        "20,480": Computed(lambda: _activation_bytes_per_row(4)),  # noqa: F821
        "1,049,600": Computed(lambda: 1024 * 1024 + 1024),  # noqa: F821
        "16,793,600": Computed(lambda: 4 * (1024 * 1024 + 1024) * 4),  # noqa: F821
    },
    3: {
        "25.6": Computed(lambda: max(_table_mb(CHAPTER, False))),  # noqa: F821
        "5.8": Computed(lambda: min(_table_mb(CHAPTER, False))),  # noqa: F821
        "16.0": Computed(lambda: max(_table_mb(CHAPTER, True))),  # noqa: F821
        "15.4": Computed(lambda: min(_table_mb(CHAPTER, True))),  # noqa: F821
        "200,000": Exempt("a table size the answer chooses"),  # noqa: F821
        "100,000": Exempt("a table size the answer chooses"),  # noqa: F821
        "19.2": Computed(lambda: max(_table_mb(TWICE, True))),  # noqa: F821
        "12.8": Computed(lambda: min(_table_mb(TWICE, False))),  # noqa: F821
    },
    5: {
        "4096": Computed(lambda: 4 * 1024),  # noqa: F821
        "512": Exempt("the example batch size the answer picks"),  # noqa: F821
    },
    6: {
        "16.8": Computed(lambda: _saved_mb(__import__("torch").nn.GELU)),  # noqa: F821
        "10.5": Computed(lambda: _saved_mb(__import__("torch").nn.ReLU)),  # noqa: F821
    },
}
