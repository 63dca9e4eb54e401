"""Which checkpoint folder is the newest, and which are deleted: ordered by the step as a number
(``step_1000000`` after ``step_999999``), complete ones only, incomplete ones pruned once a newer
checkpoint is complete; the production job's checkpoint holds tensors only."""

from pathlib import Path

import pytest

from course_utils.checkpoint import checkpoints, folders, latest_complete, step_of
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


def test_a_url_is_listed_ordered_and_pruned_as_a_local_folder_is(tmp_path):
    """``memory://`` (fsspec's in-process store: no server) against ``tmp_path``; a local folder's
    checkpoints stay ``pathlib`` paths (the object store's own test: ``test_job_object_store``)."""
    url = f"memory://folders_{tmp_path.name}"
    for root in (tmp_path, url):
        place = folders.location(root)
        for step, name in ((9, ".metadata"), (10, "__0_0.distcp"), (1_000_000, ".metadata")):
            file = place / f"step_{step:06d}" / name
            if not folders.is_url(root):
                file.parent.mkdir()
            file.write_bytes(b"")
    answers = [
        (
            [p.name for p in checkpoints(root)[0]],
            [p.name for p in checkpoints(root)[1]],
            latest_complete(root).name,
            [p.name for p in prunable(root, keep=1)],
        )
        for root in (tmp_path, url)
    ]
    assert (
        answers[0]
        == answers[1]
        == (
            ["step_000009", "step_1000000"],
            ["step_000010"],
            "step_1000000",
            ["step_000009", "step_000010"],
        )
    )
    assert type(folders.location(tmp_path)) is type(tmp_path) and not folders.is_url(tmp_path)
    assert all(type(p) is type(tmp_path) for p in checkpoints(tmp_path)[0])
    assert str(latest_complete(url)) == f"{url}/step_1000000" and step_of(f"{url}/step_000009") == 9
    for old in prunable(url, keep=1):
        folders.remove(old)
    assert [p.name for p in folders.location(url).iterdir()] == ["step_1000000"]
    assert checkpoints(f"{url}/nothing_yet") == ([], [])
