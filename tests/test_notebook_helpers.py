"""show_source and show_diff: what a learner reads is the package's own code, headed by where it lives."""

import inspect
import textwrap

import pytest

from course_utils import show_diff, show_source
from course_utils.ddp import BucketedDDP, NaiveDDP
from course_utils.pipeline.schedules import Schedule, gpipe, one_f_one_b

pytestmark = pytest.mark.chapter(0)


def test_show_source_heads_with_file_and_name_and_dedents_methods(capsys):
    show_source(Schedule.device_of)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# course_utils/pipeline/schedules.py  Schedule.device_of"
    assert out[1].startswith("def device_of(self")  # dedented: no class indentation
    assert "\n".join(out[1:]) == textwrap.dedent(inspect.getsource(Schedule.device_of)).rstrip()


def test_show_diff_is_the_change_from_one_step_to_the_next(capsys):
    show_diff(gpipe, one_f_one_b)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "--- course_utils/pipeline/schedules.py  gpipe"
    assert out[1] == "+++ course_utils/pipeline/schedules.py  one_f_one_b"
    assert "-def gpipe(p: int, m: int) -> Schedule:" in out
    assert "+def one_f_one_b(p: int, m: int) -> Schedule:" in out
    assert '     check_whole("p", p)' in out  # shared lines are context, not changes
    show_diff(NaiveDDP, BucketedDDP)
    out = capsys.readouterr().out
    assert "+class BucketedDDP" in out and "-class NaiveDDP" in out


def test_show_diff_brief_diffs_the_reading_versions(capsys):
    show_diff(NaiveDDP.finish_gradient_sync, BucketedDDP.finish_gradient_sync, brief=True)
    brief = capsys.readouterr().out
    show_diff(NaiveDDP.finish_gradient_sync, BucketedDDP.finish_gradient_sync)
    full = capsys.readouterr().out
    assert "+    # ... a bucket that never filled (a parameter without gradient) is an error" in brief
    assert "raise RuntimeError" in full and "raise RuntimeError" not in brief
    assert "-        dist.all_reduce(p.grad, group=self.group)" in brief  # step 1's blocking all-reduce goes


def test_fold_details_keeps_the_idea_and_folds_the_machinery():
    from course_utils.notebook.show import fold_details

    source = (
        "def f():\n    x = 1\n    # details: undo the signal handler\n    a()\n    b()\n"
        "    # end details\n    return x"
    )
    assert fold_details(source) == "def f():\n    x = 1\n    # ... undo the signal handler\n    return x"
    import pytest

    for broken in ("# details: a\n# details: b\n# end details", "# end details", "# details: a\nx = 1"):
        with pytest.raises(ValueError, match="line"):
            fold_details(broken)
