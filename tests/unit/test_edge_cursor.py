from hypothesis import given
from hypothesis import strategies as st

from edge.cursor import Advance, advance, heard_nodes, reachable


def test_all_acked_moves_to_the_last():
    assert advance(4, [(5, True), (6, True), (9, True)]) == Advance(9, 3, True)


def test_stops_at_the_first_unacked_even_if_later_ones_landed():
    assert advance(4, [(5, True), (6, False), (7, True)]) == Advance(5, 1, False)
    assert advance(4, [(5, False), (6, True)]) == Advance(4, 0, False)


def test_an_empty_window_changes_nothing():
    assert advance(7, []) == Advance(7, 0, True)


def test_sequences_behind_the_cursor_are_skipped():
    assert advance(6, [(5, False), (6, True), (7, True)]) == Advance(7, 1, True)


@given(st.integers(0, 100), st.lists(st.booleans(), max_size=50))
def test_cursor_never_passes_an_unacked_message(start, oks):
    results = [(start + 1 + i, ok) for i, ok in enumerate(oks)]
    a = advance(start, results)
    assert a.cursor >= start
    assert all(ok for seq, ok in results if seq <= a.cursor)
    assert a.complete == all(oks)
    if not a.complete:
        assert (a.cursor + 1, False) in results


def test_heard_nodes_within_the_window():
    assert heard_nodes({"b": 95.0, "a": 99.0, "c": 80.0}, 100.0, 10.0) == ("a", "b")


def test_reachable():
    assert not reachable(None, 100.0, 3.0)
    assert reachable(98.0, 100.0, 3.0)
    assert not reachable(96.0, 100.0, 3.0)
