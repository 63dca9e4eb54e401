"""The course's timing lessons measured on your own machine's real network: a report to share.

    python -m course_utils.scripts.gpu_report                  # every GPU (NCCL); else 2 CPU ranks (gloo)
    python -m course_utils.scripts.gpu_report --out my_report --ranks 4
    python -m course_utils.scripts.gpu_report --quick          # smaller sizes: a minute on a CPU

The chapters measure these on a modeled wire (``course_utils.runtime.wire``); here they run on
the real one, NCCL between GPUs where there are at least two, gloo on CPU otherwise (and the
report says which). Four measurements, each a section of ``report.md`` with its figure:

1. all-reduce time and bus bandwidth against message size, with the alpha-beta fit (chapter 02);
2. DDP on a dense tower: each variant's step against the same step without communication, and
   the bucket-size sweep (chapter 04);
3. the pipeline bubble of 1F1B on 2 devices, measured against the formula (chapter 06);
4. the sharded embedding lookup's step time and bytes, by sharding scheme (chapter 07).

The README invites you to add the table to its "Tested on" list.

Taught in chapter 04 (the report for learners who have GPUs).
"""

from __future__ import annotations

import argparse
import platform
import statistics
from pathlib import Path

import torch

__all__ = ["main", "build_report"]


def _plot_save(fig, path: Path) -> str:
    fig.savefig(path, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name


def _bandwidth(world: int, quick: bool, out: Path) -> list[str]:
    import torch.distributed as dist

    from course_utils import launch
    from course_utils.collectives import bandwidth

    sizes = [1 << k for k in range(10, 21 if quick else 27, 2)]
    rows = launch(
        bandwidth.sweep, {"all_reduce": dist.all_reduce}, sizes, 3 if quick else 7, world_size=world
    )[0]
    fit = bandwidth.fit_alpha_beta([r["nbytes"] for r in rows], [r["seconds"] for r in rows], world)
    lines = ["| bytes | ms | bus bandwidth (GB/s) |", "| ---: | ---: | ---: |"]
    lines += [f"| {r['nbytes']:,} | {r['seconds'] * 1e3:.3f} | {r['busbw'] / 1e9:.3f} |" for r in rows]
    lines.append(
        f"\nalpha-beta fit: alpha {fit.alpha * 1e6:.1f} us per step, peak bus bandwidth "
        f"{fit.peak_busbw / 1e9:.2f} GB/s"
    )
    name = _plot_save(
        bandwidth.plot(rows, {"all_reduce": fit}, f"all-reduce on {world} ranks"), out / "bandwidth.png"
    )
    return ["## 1. All-reduce bandwidth (chapter 02)", "", *lines, "", f"![bandwidth]({name})", ""]


def _ddp(world: int, quick: bool, out: Path) -> list[str]:
    import matplotlib.pyplot as plt

    from course_utils import launch
    from course_utils.ddp import overlap

    width, depth, rows = (128, 8, 256) if quick else (1024, 16, 4096)
    caps = [1 / 16, 1 / 4, 1.0, 4.0, 64.0]
    variants = {"none": ("none", {}), "naive": ("naive", {}), "torch default": ("torch", {})}
    variants.update(
        {
            f"bucketed {cap:g} MiB": ("bucketed", {"bucket_cap_mb": cap, "first_bucket_cap_mb": cap})
            for cap in caps
        }
    )
    result = launch(
        overlap.step_seconds, variants, width, depth, rows, 3 if quick else 8, 2, world_size=world
    )[0]
    alone = result["seconds"]["none"]
    lines = [
        f"Tower of {depth} layers of {width}, {rows} rows per rank; backward "
        f"{result['backward'] * 1e3:.1f} ms, step without communication {alone * 1e3:.1f} ms.",
        "",
        "| variant | all-reduces | step (ms) | exposed communication (ms) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, seconds in result["seconds"].items():
        if label != "none":
            lines.append(
                f"| {label} | {len(result['bucket_bytes'][label])} | {seconds * 1e3:.1f} | "
                f"{(seconds - alone) * 1e3:.1f} |"
            )
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(caps, [result["seconds"][f"bucketed {cap:g} MiB"] * 1e3 for cap in caps], "o-", label="bucketed")
    ax.axhline(result["seconds"]["torch default"] * 1e3, color="C1", ls="--", label="torch DDP default")
    ax.axhline(alone * 1e3, color="gray", ls=":", label="no communication")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="bucket size (MiB)", ylabel="step (ms)", title=f"DDP on {world} ranks")
    ax.legend(fontsize=8)
    name = _plot_save(fig, out / "ddp_buckets.png")
    return ["## 2. DDP overlap and bucket size (chapter 04)", "", *lines, "", f"![buckets]({name})", ""]


def _pipeline(quick: bool, out: Path) -> list[str]:
    from course_utils.pipeline import MLPConfig, run_schedules
    from course_utils.pipeline.schedules import one_f_one_b
    from course_utils.pipeline.simulate import gpipe_bubble_fraction

    config = MLPConfig(width=256 if quick else 2048, layers=8, batch=512 if quick else 4096)
    run = run_schedules([one_f_one_b(2, 8)], config, steps=3, timeout=300)[0]
    fastest = run.fastest
    lines = [
        f"1F1B, 2 devices, 8 micro-batches, MLP of 8 x {config.width}: step {fastest.makespan:.1f} ms, "
        f"bubble {fastest.bubble_fraction:.3f} (formula {gpipe_bubble_fraction(2, 8):.3f})"
    ]
    name = _plot_save(fastest.plot().figure, out / "pipeline.png")
    return ["## 3. Pipeline bubble (chapter 06)", "", *lines, "", f"![pipeline]({name})", ""]


def _sharding(world: int, quick: bool) -> list[str]:
    from course_utils import launch, sharding
    from course_utils.workload import data

    cards = data.criteo_cardinalities(1 / 1000 if quick else 1 / 100)
    batch, steps = (256, 3) if quick else (4096, 10)
    lines = ["| sharding | bytes per step | step (ms) |", "| --- | ---: | ---: |"]
    for kind, options in (("table_wise", {}), ("row_wise", {"split": "hash"}), ("column_wise", {})):
        results = launch(sharding.time_lookup_steps, kind, options, cards, 16, batch, steps, world_size=world)
        step = statistics.median(max(s) for s in zip(*[r[0] for r in results], strict=True))
        moved = sharding.measured([r[1] for r in results])["total"]
        lines.append(f"| {kind.replace('_', '-')} | {moved:,} | {step * 1e3:.2f} |")
    return ["## 4. Embedding all-to-all by sharding scheme (chapter 07)", "", *lines, ""]


def preset_for(gpu_name: str) -> str:
    """The device preset closest to a GPU's name ("NVIDIA H100 80GB HBM3" -> "h100"); "h100" when
    none matches (the report says which it used)."""
    from course_utils.runtime.cluster import DEVICES

    lowered = gpu_name.lower()
    return next((key for key in DEVICES if key in lowered), "h100")


def dlrm_step(device, quick: bool):
    """One training step of the course's DLRM on ``device`` (a fresh batch each call is not needed:
    the same batch, so every step runs the same kernels)."""
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
    sparse = torch.stack([torch.randint(0, c, (batch,), generator=g) for c in config.cardinalities], 1).to(
        device
    )
    labels = torch.randint(0, 2, (batch,), generator=g).float().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.binary_cross_entropy_with_logits(model(dense, sparse), labels).backward()
        opt.step()

    return step, config


def _roofline(quick: bool) -> list[str]:
    """The roofline's price of each operator of the DLRM step beside its measured kernels."""
    from course_utils.runtime.cluster import DEVICES, Cluster
    from course_utils.runtime.cluster.compare import compare_step, comparison_table
    from course_utils.runtime.hardware import gpu_names

    title = ["## 5. The roofline against this GPU's kernels (the modeled cluster, chapter 02)", ""]
    names = gpu_names()
    if not names or not torch.cuda.is_available():
        return title + ["No GPU here: this section needs one (it measures kernels on it).", ""]
    preset = preset_for(names[0])
    step, config = dlrm_step(torch.device("cuda", 0), quick)
    rows = compare_step(step, Cluster(preset, "nvlink"))
    lines = [
        f"The course's DLRM ({config.n_tables} tables, D={config.embedding_dim}, top MLP {config.top_mlp}), "
        f"one Adam step, on {names[0]}, against the roofline of the `{preset}` preset "
        f"({DEVICES[preset].name}); measured: each operator's kernels (torch.profiler, device time).",
        "",
        *comparison_table(rows),
    ]
    return title + lines + [""]


def build_report(out: Path, ranks: int | None = None, quick: bool = False) -> Path:
    """Run the four measurements and write ``out/report.md`` and its PNGs; returns the report's path."""
    import matplotlib

    matplotlib.use("Agg")
    from course_utils.runtime.hardware import gpu_count, gpu_names

    if ranks is not None and ranks < 2:
        raise SystemExit(f"--ranks must be at least 2 (there is nothing to communicate on one), got {ranks}")
    gpus = gpu_count()
    world = ranks or (gpus if gpus >= 2 else 2)
    on_gpus = gpus >= world
    network = (
        f"NCCL on {world} GPUs ({', '.join(gpu_names()[:world])})"
        if on_gpus
        else (
            f"gloo on {world} CPU processes (no {world} GPUs here: these are this machine's loopback "
            "figures, not a GPU network's)"
        )
    )
    out.mkdir(parents=True, exist_ok=True)
    header = [
        "# Course timing lessons on a real network",
        "",
        f"- network: {network}",
        f"- torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()}",
        f"- {'quick sizes' if quick else 'full sizes'}",
        "",
    ]
    sections = _bandwidth(world, quick, out) + _ddp(world, quick, out) + _pipeline(quick, out)
    sections += _sharding(world, quick) + _roofline(quick)
    path = out / "report.md"
    path.write_text("\n".join(header + sections) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_report"))
    parser.add_argument("--ranks", type=int, default=None, help="default: every GPU, or 2 CPU ranks")
    parser.add_argument("--quick", action="store_true", help="small sizes (a minute on a CPU)")
    args = parser.parse_args(argv)
    path = build_report(args.out, args.ranks, args.quick)
    print(f"wrote {path} and its figures; share the table in the README's 'Tested on' list")


if __name__ == "__main__":
    main()
