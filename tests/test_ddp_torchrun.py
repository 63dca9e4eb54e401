"""The torchrun script version trains exactly like the notebook's launch(); the progress line stays quiet."""

import io

import pytest

from course_utils import launch
from course_utils.ddp import ddp_worker
from course_utils.notebook.progress import Progress, where_progress_shows
from course_utils.runtime import runner
from course_utils.scripts import train_ddp

pytestmark = [pytest.mark.chapter(4), pytest.mark.launches]


def test_torchrun_script_matches_launch():
    run = runner.run_torchrun(module="course_utils.scripts.train_ddp", nproc_per_node=2, timeout=180)
    assert run.commands == [
        "torchrun --nproc-per-node 2 --standalone -m course_utils.scripts.train_ddp --out OUT"
    ]
    assert [r["rank"] for r in run.reports] == [0, 1] and run.reports[0]["backend"] == "gloo"
    assert run.reports[0]["fingerprint"] == run.reports[1]["fingerprint"]  # ranks identical
    # the script's defaults, through launch(): same data, seeds and loop
    args = train_ddp.parse(["--out", "unused"])
    train, held_out, model_config, settings = train_ddp.inputs(args)
    mine = launch(
        ddp_worker,
        args.kind,
        train,
        model_config,
        settings,
        held_out,
        world_size=2,
        timeout=120,
        show_output=False,
    )[0]
    theirs = run.reports[0]
    assert theirs["step_loss"] == pytest.approx(mine.step_loss, abs=1e-7)
    assert theirs["auc"] == pytest.approx(mine.final["auc"], abs=1e-9)
    for name, (total, absolute) in train_ddp.fingerprint(mine.state).items():
        assert theirs["fingerprint"][name] == pytest.approx([total, absolute], rel=1e-9, abs=1e-9), name


def test_progress_prints_nothing_outside_a_terminal_or_notebook(capsys):
    assert where_progress_shows() == "nowhere"  # pytest captures stderr: no TTY
    with Progress(3, "train") as bar:
        for loss in (0.7, 0.6, 0.5):
            bar.update(loss=loss)
    assert bar.text == "train: 3/3 steps | loss 0.5000"
    assert capsys.readouterr() == ("", "")


def test_progress_in_a_terminal_redraws_one_line_and_ends_it(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    with Progress(2, "epoch 1", every_s=0.0, mode="terminal") as bar:
        bar.update(loss=0.25)
        bar.update(loss=0.125, auc=0.75)
    lines = err.getvalue()
    assert lines.startswith("\repoch 1: 1/2 steps | loss 0.2500") and lines.endswith("\n")
    assert "\repoch 1: 2/2 steps | loss 0.1250 | auc 0.7500" in lines and lines.count("\n") == 1
    with pytest.raises(ValueError, match="mode must be"):
        Progress(1, mode="html")
