"""Which checkpoint folder is the newest, and which are deleted: ordered by the step as a number
(``step_1000000`` after ``step_999999``), complete ones only, incomplete ones pruned once a newer
checkpoint is complete; the production job's checkpoint holds tensors only."""

from pathlib import Path

import pytest

from course_utils.checkpoint import checkpoints, latest_complete, step_of
from course_utils.checkpoint.folders import prunable

pytestmark = pytest.mark.chapter(8)


def _folders(root: Path, complete: list[int], incomplete: list[int] = ()) -> None:
    for step in complete:
        (root / f"step_{step:06d}").mkdir()
        (root / f"step_{step:06d}" / ".metadata").write_bytes(b"")
    for step in incomplete:
        (root / f"step_{step:06d}").mkdir()
        (root / f"step_{step:06d}" / "__0_0.distcp").write_bytes(b"")


def test_a_checkpoint_at_step_1000000_is_newer_than_one_at_999999(tmp_path):
    _folders(tmp_path, [999_999, 1_000_000])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1000000", "step_999999"]  # as strings: wrong
    assert latest_complete(tmp_path).name == "step_1000000"
    assert [step_of(p) for p in checkpoints(tmp_path)[0]] == [999_999, 1_000_000]


def test_pruning_keeps_the_newest_and_drops_interrupted_saves_once_a_newer_one_is_complete(tmp_path):
    _folders(tmp_path, [999_998, 999_999, 1_000_000], incomplete=[999_997, 1_000_001])
    assert [p.name for p in prunable(tmp_path, keep=2)] == ["step_999998", "step_999997"]
    assert latest_complete(tmp_path).name == "step_1000000"  # step_1000001 is incomplete: skipped


def test_an_incomplete_folder_is_never_taken_for_a_complete_one(tmp_path):
    _folders(tmp_path, [], incomplete=[10])
    assert latest_complete(tmp_path) is None and prunable(tmp_path, keep=1) == []
    assert step_of(tmp_path / "step_abc") is None and step_of(tmp_path / "data") is None
