"""The dev loop's bookkeeping (conftest.py): every test file says which chapters it checks, and
``--chapter`` / ``--unit`` select what they promise."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _root_conftest():
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_test_file_names_its_chapters():
    listed = _root_conftest().CHAPTER_OF_FILE
    files = {p.name for p in (ROOT / "tests").rglob("test_*.py")}
    assert files - set(listed) == set(), "add these test files to CHAPTER_OF_FILE in conftest.py"
    assert set(listed) - files == set(), "CHAPTER_OF_FILE lists files that do not exist"


def test_every_chapter_has_unit_tests():
    by_chapter = _root_conftest().CHAPTER_OF_FILE
    covered = {n for chapters in by_chapter.values() for n in chapters}
    assert covered == set(range(9))


def test_launch_files_are_test_files():
    conf = _root_conftest()
    assert conf.LAUNCH_FILES <= set(conf.CHAPTER_OF_FILE)


def test_a_test_that_calls_launch_is_marked_from_its_source():
    conf = _root_conftest()
    assert conf.LAUNCHERS.search("    out = launch(fn, world_size=2, timeout=60)")
    assert conf.LAUNCHERS.search("run = runner.run_torchrun('course_utils.scripts.hello')")
    assert not conf.LAUNCHERS.search("    x = relaunch_count + 1")
    assert conf._NOTEBOOK_CHAPTER.match("04_ddp.ipynb")[1] == "04"
    assert conf._NOTEBOOK_CHAPTER.match("chapter07.ipynb")[2] == "07"
    assert conf._NOTEBOOK_CHAPTER.match("07a_torchrec.ipynb")[1] == "07"  # an appendix: its chapter's


def test_the_notebooks_that_need_torchrec_exist():
    """conftest.py skips these where TorchRec does not import: each name must be a real notebook."""
    names = _root_conftest().NEEDS_TORCHREC
    assert names and all((ROOT / "chapters" / name).is_file() for name in names), names


def test_notebooks_carry_no_execution_metadata():
    import json
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from strip_metadata import strip
    finally:
        sys.path.remove(str(ROOT / "tools"))
    notebooks = sorted([*ROOT.glob("chapters/*.ipynb"), *ROOT.glob("solutions/*.ipynb")])
    solutions = [p for p in notebooks if p.parent.name == "solutions"]
    assert len(solutions) == 9 and len(notebooks) >= 9 + 9  # the 9 chapters (and appendices), 9 solutions
    carrying = [p.name for p in notebooks if strip(json.loads(p.read_text()))]
    assert not carrying, f"run: python tools/strip_metadata.py {' '.join(carrying)}"
