"""``map_virtual_range``: a range of a partition's virtual data file onto its files (issue 21)."""

from __future__ import annotations

from riffle_actors.service import map_virtual_range

FILES = [("/d0", 300), ("/d1", 200)]


def test_a_range_inside_one_file() -> None:
    assert map_virtual_range(FILES, 0, 300) == [("/d0", 0, 300)]
    assert map_virtual_range(FILES, 350, 50) == [("/d1", 50, 50)]


def test_a_range_across_two_files_is_cut_at_the_base() -> None:
    assert map_virtual_range(FILES, 250, 100) == [("/d0", 250, 50), ("/d1", 0, 50)]
    assert map_virtual_range(FILES, 0, 500) == [("/d0", 0, 300), ("/d1", 0, 200)]


def test_a_range_past_the_end_goes_to_the_last_file_which_refuses_it() -> None:
    assert map_virtual_range(FILES, 450, 100) == [("/d1", 150, 100)]
    assert map_virtual_range([("/d0", 0), ("/d1", 10)], 0, 10) == [("/d1", 0, 10)]
