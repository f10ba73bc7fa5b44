"""coordinator.changes: a reader learns exactly the keys added since its mark, or is told
it cannot know (and must look at everything). Never a key missed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.changes import Changes


def test_keys_since_a_mark():
    c = Changes()
    c.add("a")
    m = c.mark()
    assert c.since(m) == set()
    c.add("b")
    c.add("a")
    assert c.since(m) == {"a", "b"}
    assert c.since(c.mark()) == set()


def test_no_mark_or_another_journals_mark_means_unknown():
    c, other = Changes(), Changes()
    assert c.since(None) is None
    assert c.since(other.mark()) is None


def test_a_reader_left_behind_by_a_trim_is_told_to_look_at_everything():
    c = Changes(keep=2)
    old = c.mark()
    c.add("a")
    c.add("b")
    current = c.mark()
    c.add("c")  # trims a and b
    assert c.since(old) is None
    assert c.since(current) == {"c"}  # read up to the trim: nothing lost


def test_keep_must_be_positive():
    with pytest.raises(ValueError, match="keep"):
        Changes(keep=0)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(1, 5), st.lists(st.one_of(st.none(), st.integers(0, 9)), max_size=60))
def test_since_is_exact_or_unknown(keep, ops):
    """None in `ops` takes a mark; an integer adds it. Every mark's answer is the set
    of keys added after it, or None only if more than `keep` were added since."""
    c = Changes(keep=keep)
    marks = []  # (mark, index into added)
    added: list[int] = []
    for op in ops:
        if op is None:
            marks.append((c.mark(), len(added)))
        else:
            c.add(op)
            added.append(op)
    for mark, at in marks:
        got = c.since(mark)
        if got is None:
            assert len(added) - at > 0  # unknown only once something was trimmed past it
            assert len(added) > keep
        else:
            assert got == set(added[at:])
