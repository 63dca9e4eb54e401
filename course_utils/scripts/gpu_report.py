"""The course's timing lessons on your own GPUs, beside the modeled cluster they are taught on.

    python -m course_utils.scripts.gpu_report                  # every GPU (NCCL); else the model alone
    python -m course_utils.scripts.gpu_report --out my_report --ranks 4
    python -m course_utils.scripts.gpu_report --quick          # smaller sizes

The chapters time every step on a modeled GPU cluster (``course_utils.runtime.cluster``): each
time is computed from the program, the same on every machine. This report runs four of those
measurements on the preset closest to this machine's GPUs (``preset_for`` the first GPU's name;
an H100 node with no GPU) and, where there are at least ``--ranks`` GPUs, measures them for real
with NCCL beside it, with the ratio measured / modeled: how far the model is from your hardware.
Each is a section of ``report.md`` with its figure:

1. all-reduce time and bus bandwidth against message size (chapter 02);
2. DDP on a dense tower: each variant's step against the step without communication, and the
   bucket-size sweep (chapter 04);
3. the pipeline bubble of 1F1B on 2 devices, against the formula (chapter 06);
4. the sharded embedding lookup's step time and bytes, by sharding scheme (chapter 07);
5. with a GPU: the roofline's price of each operator of a DLRM step beside its measured kernels.

With fewer GPUs than ranks, the modeled runs keep their tensors on the ``meta`` device (priced at
full size, never computed), so the report takes about a minute on a laptop CPU.

The README invites you to add the table to its "Tested on" list.

Taught in chapter 04 (the report for learners who have GPUs).
"""

from __future__ import annotations

import argparse
import platform
import statistics
from functools import partial
from pathlib import Path

import torch

__all__ = ["main", "build_report", "preset_for", "cluster_for", "dlrm_step", "side_by_side"]


def preset_for(gpu_name: str) -> str:
    """The device preset closest to a GPU's name ("NVIDIA H100 80GB HBM3" -> "h100"); "h100" when
    none matches (the report says which it used)."""
    from course_utils.runtime.cluster import DEVICES

    lowered = gpu_name.lower()
    return next((key for key in DEVICES if key in lowered), "h100")


def cluster_for(gpu_names: list[str]):
    """The modeled cluster the report compares with: the first GPU's preset, on PCIe 3 for a T4
    (Kaggle's and Colab's cards have no NVLink), else on NVLink; an H100 node with no GPU."""
    from course_utils.runtime.cluster import Cluster

    preset = preset_for(gpu_names[0]) if gpu_names else "h100"
    return Cluster(preset, "pcie-gen3" if preset == "t4" else "nvlink")


def side_by_side(modeled: float, measured: float | None) -> str:
    """Table cells ``modeled | measured | measured / modeled`` for two times in seconds, in ms;
    dashes where nothing was measured."""
    if measured is None:
        return f"{modeled * 1e3:.4f} | - | -"
    return f"{modeled * 1e3:.4f} | {measured * 1e3:.4f} | {measured / modeled:.2f}"


def _plot_save(fig, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path.name


def _header_row(first: str) -> list[str]:
    return [
        f"| {first} | modeled (ms) | measured (ms) | measured / modeled |",
        "| --- | ---: | ---: | ---: |",
    ]


def _bandwidth(world: int, quick: bool, out: Path, cluster, on_gpus: bool) -> list[str]:
    import torch.distributed as dist

    from course_utils import launch
    from course_utils.collectives import bandwidth

    sizes = [1 << k for k in range(10, 21 if quick else 27, 2)]
    sweep = partial(bandwidth.sweep, {"all_reduce": dist.all_reduce}, sizes)
    modeled = launch(partial(sweep, 1, device="meta"), world_size=world, cluster=cluster)[0]
    measured = launch(sweep, 3 if quick else 7, world_size=world)[0] if on_gpus else None
    lines = _header_row("bytes")
    for k, row in enumerate(modeled):
        real = measured[k]["seconds"] if measured else None
        lines.append(f"| {row['nbytes']:,} | {side_by_side(row['seconds'], real)} |")
    rows, fits = [], {}
    for name, got in (("modeled", modeled), ("measured (NCCL)", measured)):
        if got:
            rows += [{**r, "name": name} for r in got]
            fits[name] = bandwidth.fit_alpha_beta(
                [r["nbytes"] for r in got], [r["seconds"] for r in got], world
            )
            lines.append(
                f"\n{name}: alpha-beta fit alpha {fits[name].alpha * 1e6:.2f} us per step, peak bus "
                f"bandwidth {fits[name].peak_busbw / 1e9:.1f} GB/s"
            )
    figure = bandwidth.plot(rows, fits, f"all-reduce on {world} ranks", timed="dist.all_reduce")
    name = _plot_save(figure, out / "bandwidth.png")
    return ["## 1. All-reduce bandwidth (chapter 02)", "", *lines, "", f"![bandwidth]({name})", ""]


def _ddp(world: int, quick: bool, out: Path, cluster, on_gpus: bool) -> list[str]:
    import matplotlib.pyplot as plt

    from course_utils import launch
    from course_utils.ddp import overlap

    width, depth, rows = (128, 8, 256) if quick else (1024, 16, 4096)
    caps = [1 / 16, 1 / 4, 1.0, 4.0, 64.0]
    variants = {"none": ("none", {}), "naive": ("naive", {})}
    variants.update(
        {
            f"bucketed {cap:g} MiB": ("bucketed", {"bucket_cap_mb": cap, "first_bucket_cap_mb": cap})
            for cap in caps
        }
    )
    shape = (width, depth, rows)
    # torch's DDP checks the parameters' shapes across ranks, which meta tensors cannot: the model
    # times the course's by-hand DDP, the GPUs PyTorch's too
    modeled = launch(
        partial(overlap.step_seconds, variants, *shape, steps=1, rounds=1, device="meta"),
        world_size=world,
        cluster=cluster,
    )[0]
    measured = None
    if on_gpus:
        variants["torch default"] = ("torch", {})
        measured = launch(
            partial(overlap.step_seconds, variants, *shape, steps=3 if quick else 8), world_size=world
        )[0]
    alone = modeled["seconds"]["none"]
    lines = [
        f"Tower of {depth} layers of {width}, {rows} rows per rank, SGD; modeled step without "
        f"communication {alone * 1e3:.3f} ms (its backward {modeled['backward'] * 1e3:.3f} ms).",
        "",
        *_header_row("variant (all-reduces)"),
    ]
    for label in variants:
        got = modeled["seconds"].get(label)
        real = measured["seconds"][label] if measured else None
        calls = len((measured or modeled)["bucket_bytes"][label])
        if got is not None:
            lines.append(f"| {label} ({calls}) | {side_by_side(got, real)} |")
        else:
            lines.append(f"| {label} ({calls}) | - | {real * 1e3:.3f} | - |")
    fig, ax = plt.subplots(figsize=(6, 3))
    for k, (name, got) in enumerate((("modeled", modeled), ("measured", measured))):
        if got:
            ax.plot(
                caps,
                [got["seconds"][f"bucketed {c:g} MiB"] * 1e3 for c in caps],
                "o-",
                color=f"C{k}",
                label=name,
            )
            ax.axhline(got["seconds"]["none"] * 1e3, color=f"C{k}", ls=":", label=f"{name}, no communication")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="bucket size (MiB)", ylabel="step (ms)", title=f"DDP on {world} ranks")
    ax.legend(fontsize=8)
    name = _plot_save(fig, out / "ddp_buckets.png")
    return ["## 2. DDP overlap and bucket size (chapter 04)", "", *lines, "", f"![buckets]({name})", ""]


def _pipeline(quick: bool, out: Path, cluster, on_gpus: bool) -> list[str]:
    from course_utils.pipeline import MLPConfig, run_schedules
    from course_utils.pipeline.schedules import one_f_one_b
    from course_utils.pipeline.simulate import gpipe_bubble_fraction

    config = MLPConfig(width=256 if quick else 2048, layers=8, batch=512 if quick else 4096)
    schedule = one_f_one_b(2, 8)
    modeled = run_schedules([schedule], config, steps=1, cluster=cluster, meta=True)[0].fastest
    measured = run_schedules([schedule], config, steps=3, timeout=300)[0].fastest if on_gpus else None
    lines = [  # makespans are in ms
        f"1F1B, 2 devices, 8 micro-batches, MLP of 8 x {config.width}, {config.batch} rows "
        f"(bubble formula {gpipe_bubble_fraction(2, 8):.3f}):",
        "",
        *_header_row("1F1B"),
        f"| step | {side_by_side(modeled.makespan / 1e3, measured.makespan / 1e3 if measured else None)} |",
        f"| bubble (fraction) | {modeled.bubble_fraction:.3f} | "
        f"{f'{measured.bubble_fraction:.3f}' if measured else '-'} | - |",
    ]
    name = _plot_save(modeled.plot().figure, out / "pipeline.png")
    return ["## 3. Pipeline bubble (chapter 06)", "", *lines, "", f"![pipeline, modeled]({name})", ""]


def _sharding(world: int, quick: bool, cluster, on_gpus: bool) -> list[str]:
    from course_utils import launch, sharding
    from course_utils.workload import data

    cards = data.criteo_cardinalities(1 / 1000 if quick else 1 / 100)
    dim, batch = (16, 256) if quick else (64, 4096)
    lines = _header_row("sharding (bytes per step)")
    for kind, options in (("table_wise", {}), ("row_wise", {"split": "hash"}), ("column_wise", {})):
        ranks = launch(
            sharding.modeled_lookup_step, kind, options, cards, dim, batch, world_size=world, cluster=cluster
        )
        moved = sharding.measured([r["traffic"] for r in ranks])["total"]
        real = None
        if on_gpus:
            results = launch(
                sharding.time_lookup_steps, kind, options, cards, dim, batch, 10, world_size=world
            )
            real = statistics.median(max(s) for s in zip(*[r[0] for r in results], strict=True))
        lines.append(
            f"| {kind.replace('_', '-')} ({moved:,}) | {side_by_side(ranks[0]['step_ns'] / 1e9, real)} |"
        )
    return ["## 4. Embedding all-to-all by sharding scheme (chapter 07)", "", *lines, ""]


def dlrm_step(device, quick: bool):
    """One training step of the course's DLRM on ``device`` (the same batch each call, so every
    step runs the same kernels)."""
    from course_utils.workload.data import criteo_cardinalities
    from course_utils.workload.models import DLRMConfig

    config = DLRMConfig(
        criteo_cardinalities(1 / 1000 if quick else 1 / 100),
        embedding_dim=16 if quick else 64,
        bottom_mlp=(64,) if quick else (512, 256),
        top_mlp=(64, 32) if quick else (1024, 1024, 512, 256),
    )
    model = config.build(seed=0).to(device)
    batch = 256 if quick else 4096
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(batch, config.n_dense, generator=g).to(device)
    sparse = torch.stack([torch.randint(0, c, (batch,), generator=g) for c in config.cardinalities], 1)
    sparse = sparse.to(device)
    labels = torch.randint(0, 2, (batch,), generator=g).float().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.binary_cross_entropy_with_logits(model(dense, sparse), labels).backward()
        opt.step()

    return step, config


def _roofline(quick: bool, cluster) -> list[str]:
    """The roofline's price of each operator of the DLRM step beside its measured kernels."""
    from course_utils.runtime.cluster.compare import compare_step, comparison_table
    from course_utils.runtime.hardware import gpu_names

    title = ["## 5. The roofline against this GPU's kernels (the modeled cluster, chapter 02)", ""]
    names = gpu_names()
    if not names or not torch.cuda.is_available():
        return title + ["No GPU here: this section needs one (it measures kernels on it).", ""]
    step, config = dlrm_step(torch.device("cuda", 0), quick)
    rows = compare_step(step, cluster)
    lines = [
        f"The course's DLRM ({config.n_tables} tables, D={config.embedding_dim}, top MLP {config.top_mlp}), "
        f"one Adam step, on {names[0]}, against the roofline of {cluster.device.name}; measured: each "
        "operator's kernels (torch.profiler, device time).",
        "",
        *comparison_table(rows),
    ]
    return title + lines + [""]


def build_report(out: Path, ranks: int | None = None, quick: bool = False) -> Path:
    """Run the measurements and write ``out/report.md`` and its PNGs; returns the report's path."""
    import matplotlib

    matplotlib.use("Agg")
    from course_utils.runtime.hardware import gpu_count, gpu_names

    if ranks is not None and ranks < 2:
        raise SystemExit(f"--ranks must be at least 2 (there is nothing to communicate on one), got {ranks}")
    gpus, names = gpu_count(), gpu_names()
    world = ranks or (gpus if gpus >= 2 else 2)
    on_gpus = gpus >= world
    cluster = cluster_for(names)
    measured = (
        f"NCCL on {world} GPUs ({', '.join(names[:world])})"
        if on_gpus
        else f"nothing: {gpus} GPU(s) here, fewer than {world} ranks (the modeled columns only)"
    )
    out.mkdir(parents=True, exist_ok=True)
    header = [
        "# Course timing lessons: the modeled cluster and this machine",
        "",
        f"- modeled: {cluster.label}, {world} ranks (virtual time: the same on every machine)",
        f"- measured: {measured}",
        f"- torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()}",
        f"- {'quick sizes' if quick else 'full sizes'}",
        "",
    ]
    sections = _bandwidth(world, quick, out, cluster, on_gpus) + _ddp(world, quick, out, cluster, on_gpus)
    sections += _pipeline(quick, out, cluster, on_gpus) + _sharding(world, quick, cluster, on_gpus)
    sections += _roofline(quick, cluster)
    path = out / "report.md"
    path.write_text("\n".join(header + sections) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_report"))
    parser.add_argument("--ranks", type=int, default=None, help="default: every GPU, or 2")
    parser.add_argument("--quick", action="store_true", help="small sizes")
    args = parser.parse_args(argv)
    path = build_report(args.out, args.ranks, args.quick)
    print(f"wrote {path} and its figures; share the table in the README's 'Tested on' list")


if __name__ == "__main__":
    main()
