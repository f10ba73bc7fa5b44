"""edge/merge.py: a window of a site's stored events merged into fewer messages, each
node's events in the site's order, no two events of one attempt in one batch."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edge.merge import Stored, merge_window
from mesh import subjects
from mesh.codec import encode
from mesh.schema import MAX_EVENT_BATCH, TaskEvent, TaskEventBatch, decode_task_events
from workloads.lifecycle import TaskState

R, S = "eu", "s1"


def ev(node: str, task: str, attempt: int, state: TaskState) -> TaskEvent:
    return TaskEvent(node, "j", task, attempt, state, 1.0)


def stored(seq: int, node: str, *events: TaskEvent) -> Stored:
    data = encode(events[0]) if len(events) == 1 else encode(TaskEventBatch(node, events))
    return Stored(seq, subjects.site_events(R, S, node), data, f"id-{seq}")


def test_a_nodes_events_go_in_one_batch_in_order_and_a_lone_message_as_it_was():
    a1 = ev("a", "t1", 1, TaskState.RUNNING)
    a2 = ev("a", "t2", 1, TaskState.RUNNING)
    b1 = ev("b", "t3", 1, TaskState.RUNNING)
    window = [stored(1, "a", a1), stored(2, "b", b1), stored(3, "a", a2)]
    units = merge_window(R, S, window)
    assert [(u.seqs, u.node) for u in units] == [((1, 3), "a"), ((2,), "b")]
    assert decode_task_events(units[0].data) == ("a", (a1, a2))
    assert units[0].headers["Nats-Msg-Id"].startswith("site-merge:")
    assert units[1].data == window[1].data and units[1].headers == {"Nats-Msg-Id": "id-2"}


def test_two_events_of_one_attempt_go_in_two_batches_in_order():
    run = ev("a", "t1", 1, TaskState.RUNNING)
    done = ev("a", "t1", 1, TaskState.SUCCEEDED)
    units = merge_window(R, S, [stored(1, "a", run), stored(2, "a", done)])
    assert [u.seqs for u in units] == [(1,), (2,)]


def test_what_does_not_decode_or_is_not_an_events_subject_goes_alone():
    bad = Stored(1, subjects.site_events(R, S, "a"), b"\xc1junk", "x")
    other = Stored(2, "mesh.eu.site.s1.something", b"", None)
    lying = stored(3, "b", ev("a", "t1", 1, TaskState.RUNNING))  # b speaking for a
    units = merge_window(R, S, [bad, other, lying])
    assert [(u.seqs, u.node, u.data) for u in units] == [
        ((1,), "a", bad.data),
        ((2,), None, b""),
        ((3,), "b", lying.data),
    ]


@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 30), st.sampled_from(list(TaskState))),
        max_size=300,
    )
)
def test_every_event_once_per_node_in_order_within_the_batch_bound(items):
    window, want = [], {}
    for seq, (node, task, state) in enumerate(items, start=1):
        e = ev(node, f"t{task}", 1, state)
        window.append(stored(seq, node, e))
        want.setdefault(node, []).append(e)
    units = merge_window(R, S, window)
    got: dict[str, list] = {}
    seqs = []
    for u in units:
        node, events = decode_task_events(u.data)
        assert node == u.node and len(events) <= MAX_EVENT_BATCH
        assert len({(e.task_id, e.attempt) for e in events}) == len(events)
        got.setdefault(node, []).extend(events)
        seqs.extend(u.seqs)
    assert got == want and sorted(seqs) == list(range(1, len(items) + 1))
