"""The input checks every taught function shares (course_utils.runtime.checks): one place, clear messages."""

import numpy as np
import pytest
import torch

from course_utils.runtime.checks import check_choice, check_ids, check_sizes, check_whole, check_width

pytestmark = pytest.mark.chapter(0)


def test_check_ids_one_id_per_table_or_bags():
    cards = [3, 5]
    check_ids(torch.tensor([[0, 4], [2, 0]]), cards)
    check_ids(torch.zeros(0, 2, dtype=torch.long), cards)  # an empty batch is fine
    check_ids(torch.tensor([[[0, 1], [4, 4]]]), cards, bags=True)  # [B, T, L]
    with pytest.raises(ValueError, match=r"ids must be \[B, 2\] \(one id per table\), got shape \(1, 2, 2\)"):
        check_ids(torch.tensor([[[0, 1], [4, 4]]]), cards)
    with pytest.raises(ValueError, match=r"sparse must be \[B, 2\] or \[B, 2, L\]"):
        check_ids(torch.zeros(3, 4, dtype=torch.long), cards, name="sparse", bags=True)
    with pytest.raises(TypeError, match=r"ids must be int64 ids, got torch.int32; use ids.long\(\)"):
        check_ids(torch.zeros(3, 2, dtype=torch.int32), cards)
    with pytest.raises(IndexError, match=r"table 1 has 5 rows but got ids in \[4, 5\]; hash or clip"):
        check_ids(torch.tensor([[[0, 1], [4, 5]]]), cards, bags=True)
    with pytest.raises(IndexError, match=r"table 0 has 3 rows but got ids in \[-1, 0\]"):
        check_ids(torch.tensor([[-1, 0], [0, 0]]), torch.tensor(cards))  # sizes as a tensor (a buffer)


def test_sizes_whole_numbers_widths_and_choices():
    assert check_sizes([3, np.int64(4)]) == (3, 4)
    for bad in ([], [3, 0]):
        with pytest.raises(ValueError, match="cardinalities must be positive table sizes"):
            check_sizes(bad)
    with pytest.raises(ValueError, match="at most 7 rows each"):
        check_sizes([8], most=7)
    check_whole("p", np.int64(2))
    for bad in (0, 2.0, True, "2", None):
        with pytest.raises(ValueError, match="p must be a whole number >= 1, got "):
            check_whole("p", bad)
    with pytest.raises(ValueError, match="v must be a whole number >= 2, got 1"):
        check_whole("v", 1, low=2)
    check_width(torch.zeros(2, 3), "dense", 3)
    with pytest.raises(ValueError, match=r"dense must be \[B, 4\], got shape \(2, 3\)"):
        check_width(torch.zeros(2, 3), "dense", 4)
    with pytest.raises(ValueError, match=r"unknown optimizer 'lion'; choose one of \['adam', 'sgd'\]; or"):
        check_choice("optimizer", "lion", {"sgd": 0, "adam": 2}, hint="; or")
