"""Human output: tables that never cut a reason, readable units and counts, the
waiting reason `job run --wait` reports, `--task` choice, and `mesh load`'s summary."""

from __future__ import annotations

import pytest

from mesh.cli import jobs, load, output, render

REASON = (
    "agent refused: this agent runs as root with neither --run-as nor --allow-root; "
    "start it with --run-as USER so tasks do not run as root"
)


def task(i: int, state: str = "RUNNING", message: str = "", **kw) -> dict:
    return {
        "task_id": f"train-1a2b.main.{i}",
        "role": "main",
        "index": i,
        "state": state,
        "attempt": 1,
        "node_id": "n1",
        "exit_code": None,
        "gpu_uuids": [],
        "message": message,
        "log_tail": "",
        "placed_at": None,
        "started_at": None,
        "finished_at": None,
        "history": [],
    } | kw


def job(tasks: list[dict], **kw) -> dict:
    return {
        "job_id": "train-1a2b",
        "name": "train",
        "state": "RUNNING",
        "pool": "/",
        "priority": 0,
        "tasks": len(tasks),
        "task_states": {},
        "kill_requested": False,
        "kill_reason": "",
        "submitted_at": 1.0,
        "finished_at": None,
        "pending_reason": None,
        "task_list": tasks,
    } | kw


def test_table_wraps_the_last_column_and_keeps_every_word():
    rows = [["t1", "FAILED", REASON], ["t2", "RUNNING", "ok"]]
    text = render.table(rows, ["TASK", "STATE", "MESSAGE"], width=60)
    lines = text.splitlines()
    assert all(len(ln) <= 60 for ln in lines)
    assert " ".join(" ".join(ln.split()) for ln in lines).count("--run-as USER") == 1
    words = " ".join(ln[len("TASK  STATE    ") :].strip() for ln in lines[1:-1])
    assert words == REASON  # continuation lines start under MESSAGE
    assert render.table(rows, ["TASK", "STATE", "MESSAGE"]).splitlines()[1].endswith(REASON)


def test_job_status_shows_the_whole_message():
    text = render.job_detail(job([task(0, "FAILED", REASON)]))
    assert REASON in text


def test_waiting_reason_prefers_the_scheduler_then_the_tasks():
    assert render.waiting_reason(job([task(0, "PENDING")], pending_reason="pool / is full")) == (
        "pool / is full"
    )
    why = render.waiting_reason(job([task(0, "PLACED", placed_at=0.0), task(1, "PLACED")]))
    assert why.startswith("task train-1a2b.main.0 PLACED on node n1 since ")
    assert "no word from its agent yet" in why and "1 more not started" in why
    why = render.waiting_reason(job([task(0, "PLACED", "assignment refused: bad signature")]))
    assert why.endswith("assignment refused: bad signature")
    assert (
        render.waiting_reason(job([task(0), task(1)])) == "2 of 2 tasks RUNNING (not finished yet)"
    )


def test_pool_memory_in_human_units_and_exact_when_wide():
    pool = {
        "path": "/",
        "leaf": True,
        "kinds": {
            "cpu": dict.fromkeys(render.POOL_FIELDS, "0") | {"limit": "-", "share": 1.0},
            "memory": dict.fromkeys(render.POOL_FIELDS, "0")
            | {"limit": "-", "entitlement": "502834240Ki", "share": 1.0},
            "gpu": dict.fromkeys(render.POOL_FIELDS, "0") | {"limit": "-"},
        },
    }
    text = render.pools_table([pool])
    assert "480Gi" in text and "502834240Ki" not in text and "gpu" not in text
    wide = render.pools_table([pool], wide=True)
    assert "502834240Ki" in wide and "gpu" in wide


def test_cluster_info_is_readable():
    info = {
        "ok": True,
        "region": "eu",
        "answered_by": "c2",
        "leader": "c1",
        "term": 3,
        "log_seq": 42,
        "nodes": {"ready": 3, "down": 1},
        "jobs": {"SUCCEEDED": 2},
        "version": "0.1",
    }
    text = render.cluster_lines(info)
    assert "{" not in text and "'" not in text
    assert "nodes       down 1, ready 3" in text and "jobs        succeeded 2" in text
    assert "leader      c1   term 3" in text


def test_wide_tables_add_columns():
    node = {
        "node_id": "n1",
        "status": "ready",
        "simulated": False,
        "zone": "",
        "capacity": {"cpu": 4000, "memory": 2**33},
        "allocated": {"cpu": 500, "memory": 2**30},
        "gpus": [],
        "cpu_percent": 3.0,
        "memory_used": 2**30,
        "tasks": 1,
        "labels": {"rack": "r1"},
        "heartbeat_age_s": 0.4,
        "note": "",
    }
    assert "LABELS" not in render.nodes_table([node])
    wide = render.nodes_table([node], wide=True)
    assert "LABELS" in wide and "rack=r1" in wide and "500m" in wide
    summary = job([task(0)]) | {"task_states": {"RUNNING": 1}}
    assert "NAME" in render.jobs_table([summary], wide=True)
    assert "NAME" not in render.jobs_table([summary])


def test_output_formats():
    data = {"a": [1, "x"], "b": None}
    assert (
        output.render("json", data, "human") == '{\n  "a": [\n    1,\n    "x"\n  ],\n  "b": null\n}'
    )
    assert output.render("yaml", data, "human") == "a:\n- 1\n- x\nb: null"
    assert output.render("table", data, "human", "wide") == "human"
    assert output.render("wide", data, "human", "wide") == "wide"
    assert output.render("wide", data, "human") == "human"  # no wide form: the table


TASKS = [
    task(0, role="main", task_id="train-1a2b.main.0"),
    task(1, role="main", task_id="train-1a2b.main.1"),
    task(0, role="ps", task_id="train-1a2b.ps.0"),
]


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (None, "train-1a2b.main.0"),
        ("train-1a2b.ps.0", "train-1a2b.ps.0"),
        ("ps", "train-1a2b.ps.0"),
        ("1", "train-1a2b.main.1"),
        ("main.1", "train-1a2b.main.1"),
        ("ps.0", "train-1a2b.ps.0"),
        ("train-1a2b.p", "train-1a2b.ps.0"),
    ],
)
def test_task_choice(key, expected):
    assert jobs.resolve_task(TASKS, key)["task_id"] == expected


@pytest.mark.parametrize(
    ("key", "says"),
    [("0", "matches 2 tasks by index"), ("main", "matches 2 tasks by role"), ("zz", "no task")],
)
def test_task_choice_refuses_ambiguity(key, says):
    with pytest.raises(jobs.TaskChoiceError, match=says):
        jobs.resolve_task(TASKS, key)


def test_never_started():
    assert jobs.never_started(task(0, "PENDING"))
    assert not jobs.never_started(task(0, started_at=5.0))
    retried = task(0, "PENDING", history=[{"state": "RUNNING", "node_id": "n1"}])
    assert not jobs.never_started(retried)


def test_selector_picks_active_unkilled_jobs():
    listed = [
        {"job_id": "a", "state": "PENDING", "pool": "/x", "kill_requested": False},
        {"job_id": "b", "state": "RUNNING", "pool": "/x", "kill_requested": True},
        {"job_id": "c", "state": "RUNNING", "pool": "/y", "kill_requested": False},
        {"job_id": "d", "state": "FAILED", "pool": "/x", "kill_requested": False},
    ]
    assert jobs.selected(listed, None, None) == ["a", "c"]
    assert jobs.selected(listed, "RUNNING", None) == ["c"]
    assert jobs.selected(listed, None, "/x") == ["a"]


def _summary(rate):
    result = load.LoadResult(jobs=1, tasks=1, late=3, max_lag_s=0.5, elapsed_s=1.0)
    result.failed("INVALID_SPEC", "pool: / has child pools; jobs go to leaf pools")
    result.failed("INVALID_SPEC", "another message")
    workload = load.describe([])
    return load.human(result.summary(workload, 4, rate))


def test_load_names_the_error_and_speaks_of_rate_only_with_one():
    text = _summary(None)
    assert "error INVALID_SPEC x2, e.g.: pool: / has child pools" in text
    assert "another message" not in text and "--rate" not in text
    assert "did not keep up with --rate 50" in _summary(50.0)
