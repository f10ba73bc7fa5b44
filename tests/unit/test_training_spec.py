"""The training fields of a job spec (workloads/training.py): each rule, and the field
each error names."""

from __future__ import annotations

import pytest

from workloads import SpecError, parse_job_spec
from workloads.spark_memory import MASTER_CPU, MASTER_MEMORY
from workloads.spec import MAX_COUNT, MAX_RETRIES, MAX_TASKS
from workloads.training import ELASTIC_FRAMEWORKS, FRAMEWORKS, MAX_PORTS, MAX_SLOTS

WORKER = {"role": "worker", "command": ["python", "train.py"], "resources": {"cpu": 1}}


def _train(framework: str = "pytorch-elastic", tasks: list | None = None, **fields) -> dict:
    spec = {"name": "tiny", "framework": framework, "tasks": tasks or [dict(WORKER)]}
    spec.update(fields)
    return spec


def _spark(tasks: list | None = None, **fields) -> dict:
    default = [{"role": "worker"}, {"role": "driver", "command": ["wordcount.py", "in.txt"]}]
    return _train("spark", [_jvm_sized(g) for g in tasks or default], **fields)


def _jvm_sized(group: dict) -> dict:
    """A spark worker or driver with room for its JVM (workloads/spark_memory.py)."""
    if group.get("role") in ("worker", "driver") and "resources" not in group:
        return {**group, "resources": {"memory": "2Gi"}}
    return group


def test_a_spark_worker_or_driver_too_small_for_its_jvm_is_refused():
    small = {"role": "worker", "resources": {"memory": "512Mi"}}
    err = _error(_spark([small, DRIVER]))
    assert err.field == "tasks[0].resources.memory"
    assert "a spark worker needs at least" in str(err)
    small_driver = {**DRIVER, "resources": {"memory": "256Mi"}}
    assert _error(_spark([{"role": "worker"}, small_driver])).field == "tasks[1].resources.memory"


DRIVER = {"role": "driver", "command": "x"}


def _error(source) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_job_spec(source)
    return info.value


def _round_trip(spec):
    again = parse_job_spec(spec.to_dict())
    assert again == spec
    return again


def test_the_design_example_parses():
    spec = parse_job_spec(
        """
name: tiny
framework: pytorch-elastic
workers: {min: 2, max: 3}
slots_per_node: 1
max_restarts: 3
tasks:
  - role: worker
    command: [python, train.py]
    ports: [metrics]
    resources: {cpu: 1, memory: 1Gi}
"""
    )
    assert spec.framework == "pytorch-elastic"
    assert (spec.workers_min, spec.workers_max, spec.min_tasks) == (2, 3, 2)
    assert spec.is_elastic
    (group,) = spec.tasks
    assert group.count == 3 and group.ports == ("metrics",)
    assert (spec.slots_per_node, spec.max_restarts) == (1, 3)
    data = spec.to_dict()
    assert data["workers"] == {"min": 2, "max": 3} and data["min_tasks"] is None
    assert data["tasks"][0]["ports"] == ["metrics"]
    _round_trip(spec)


def test_a_batch_job_is_unchanged():
    spec = parse_job_spec({"name": "b", "tasks": [{"role": "a", "command": "x", "count": 4}]})
    assert spec.framework == "batch" and spec.workers_min is None and not spec.is_elastic
    data = spec.to_dict()
    for key in ("framework", "workers", "slots_per_node", "max_restarts"):
        assert key not in data
    assert "ports" not in data["tasks"][0]
    # An explicit `framework: batch` is the default, also on a service.
    assert parse_job_spec({**_job_b(), "framework": "batch"}) == parse_job_spec(_job_b())
    service = {**_job_b(), "kind": "service", "framework": "batch"}
    assert parse_job_spec(service).is_service


def _job_b() -> dict:
    return {"name": "b", "tasks": [{"role": "a", "command": "x"}]}


def test_batch_min_tasks_still_works():
    spec = parse_job_spec({**_job_b(), "min_tasks": 1})
    assert spec.min_tasks == 1 and spec.framework == "batch"
    _round_trip(spec)


@pytest.mark.parametrize("framework", [f for f in FRAMEWORKS if f not in ("batch", "spark")])
def test_fixed_workers_set_the_count(framework):
    spec = parse_job_spec(_train(framework, workers=4))
    assert spec.tasks[0].count == 4
    assert (spec.workers_min, spec.workers_max, spec.min_tasks) == (None, None, None)
    assert not spec.is_elastic
    assert "workers" not in spec.to_dict()  # a fixed size is the group's count
    _round_trip(spec)
    # Without `workers` the group's count is the size.
    assert parse_job_spec(_train(framework, [{**WORKER, "count": 5}])).tasks[0].count == 5
    # A count that agrees with workers is fine.
    same = parse_job_spec(_train(framework, [{**WORKER, "count": 4}], workers=4))
    assert same == spec


def test_min_equal_to_max_is_a_fixed_size():
    spec = parse_job_spec(_train(workers={"min": 3, "max": 3}))
    assert spec == parse_job_spec(_train(workers=3))
    assert not spec.is_elastic and spec.min_tasks is None


@pytest.mark.parametrize("framework", ELASTIC_FRAMEWORKS)
def test_elastic_workers(framework):
    spec = parse_job_spec(_train(framework, workers={"min": 1, "max": MAX_COUNT}))
    assert spec.tasks[0].count == MAX_COUNT
    assert (spec.workers_min, spec.workers_max, spec.min_tasks) == (1, MAX_COUNT, 1)
    _round_trip(spec)


def test_slots_and_max_restarts():
    spec = parse_job_spec(_train("mpi", slots_per_node=MAX_SLOTS, max_restarts=0))
    assert (spec.slots_per_node, spec.max_restarts) == (MAX_SLOTS, 0)
    data = spec.to_dict()
    assert (data["slots_per_node"], data["max_restarts"]) == (MAX_SLOTS, 0)
    _round_trip(spec)
    top = parse_job_spec(_train("mpi", max_restarts=MAX_RETRIES))
    assert top.max_restarts == MAX_RETRIES
    # The defaults are not written.
    plain = parse_job_spec(_train("mpi")).to_dict()
    assert "slots_per_node" not in plain and "max_restarts" not in plain
    assert plain["framework"] == "mpi"


def test_spark_adds_its_master():
    spec = parse_job_spec(_spark(workers=3))
    assert [(g.role, g.count) for g in spec.tasks] == [("master", 1), ("worker", 3), ("driver", 1)]
    master = spec.tasks[0]
    assert master.command == () and master.simulate is None
    # Room for its JVM (~156 MiB resident): not the 64Mi of a task that names none.
    assert (master.resources.cpu, master.resources.memory) == (MASTER_CPU, MASTER_MEMORY)
    assert spec.tasks[1].command == ()  # the framework starts the worker daemon
    assert spec.tasks[2].command == ("wordcount.py", "in.txt")
    assert not spec.is_elastic and spec.min_tasks is None
    _round_trip(spec)


def test_spark_keeps_a_given_master_and_order():
    tasks = [
        {"role": "driver", "command": ["app.py"]},
        {"role": "worker", "count": 2, "resources": {"cpu": 2, "memory": "2Gi"}},
        {"role": "master", "resources": {"cpu": 1}},
    ]
    spec = parse_job_spec(_spark(tasks))
    assert [(g.role, g.count) for g in spec.tasks] == [("driver", 1), ("worker", 2), ("master", 1)]
    assert spec.tasks[2].resources.cpu == 1000
    _round_trip(spec)
    # `workers` sets the worker group's count, wherever it is.
    added = parse_job_spec(_spark(tasks[:1] + [{"role": "worker"}], workers=5))
    assert [(g.role, g.count) for g in added.tasks] == [("master", 1), ("driver", 1), ("worker", 5)]


def test_ports():
    names = [f"p{i}" for i in range(MAX_PORTS)]
    spec = parse_job_spec({"name": "b", "tasks": [{"role": "a", "command": "x", "ports": names}]})
    assert spec.tasks[0].ports == tuple(names)  # in the order given
    _round_trip(spec)
    longest = "a" + "-" * 31
    one = parse_job_spec(
        {"name": "b", "tasks": [{"role": "a", "command": "x", "ports": [longest]}]}
    )
    assert one.tasks[0].ports == (longest,)


def _group(**fields) -> dict:
    return {
        "name": "b",
        "tasks": [{"role": "a", "command": "x"}, {"role": "b", "command": "y", **fields}],
    }


BAD = [
    # (spec, field, words in the problem)
    (_train("tensorflow"), "framework", "expected one of batch, pytorch, pytorch-elastic, "
     "horovod-elastic, mpi, spark; got 'tensorflow'"),
    (_train(7), "framework", "expected one of"),
    ({**_train(), "kind": "service"}, "framework", "does not apply to kind: service"),
    ({**_job_b(), "workers": 2}, "workers", "applies only to a training framework"),
    ({**_job_b(), "slots_per_node": 2}, "slots_per_node", "applies only to a training framework"),
    ({**_job_b(), "max_restarts": 1}, "max_restarts", "applies only to a training framework"),
    ({**_job_b(), "kind": "service", "workers": 2}, "workers", "applies only to a training"),
    (_train(workers=0), "workers", "between 1 and 10000"),
    (_train(workers=MAX_COUNT + 1), "workers", "between 1 and 10000"),
    (_train(workers=True), "workers", "expected a number or a mapping"),
    (_train(workers="3"), "workers", "expected a number or a mapping"),
    (_train(workers=[1, 2]), "workers", "expected a number or a mapping"),
    (_train(workers={"min": 2}), "workers.max", "required"),
    (_train(workers={"max": 2}), "workers.min", "required"),
    (_train(workers={"min": 2, "max": 3, "step": 1}), "workers.step", "unknown field"),
    (_train(workers={"min": 0, "max": 3}), "workers.min", "between 1 and 10000"),
    (_train(workers={"min": 1, "max": MAX_COUNT + 1}), "workers.max", "between 1 and 10000"),
    (_train(workers={"min": 1.5, "max": 3}), "workers.min", "expected an integer"),
    (_train(workers={"min": 4, "max": 3}), "workers.min", "must be at most workers.max (3)"),
    (_train("pytorch", workers={"min": 2, "max": 3}), "workers", "pytorch is not elastic"),
    (_train("mpi", workers={"min": 2, "max": 3}), "workers", "mpi is not elastic"),
    (_spark(workers={"min": 2, "max": 3}), "workers", "spark is not elastic"),
    (_train(workers=3, min_tasks=2), "min_tasks", "does not apply to framework"),
    (_train(min_tasks=1), "min_tasks", "does not apply to framework"),
    (_train(tasks=[{**WORKER, "count": 2}], workers=3), "tasks[0].count",
     "must equal workers (3) or be left out, got 2"),
    (_train(tasks=[{**WORKER, "count": 2}], workers={"min": 1, "max": 3}), "tasks[0].count",
     "must equal workers (3)"),
    (_train(tasks=[dict(WORKER), {**WORKER, "role": "ps"}]), "tasks",
     "a pytorch-elastic job has exactly one task group (its workers), got 2"),
    (_train("mpi", [{"role": "worker"}]), "tasks[0].command", "required"),
    (_train(slots_per_node=0), "slots_per_node", "between 1 and 256"),
    (_train(slots_per_node=MAX_SLOTS + 1), "slots_per_node", "between 1 and 256"),
    (_train(slots_per_node="2"), "slots_per_node", "expected an integer"),
    (_train(max_restarts=-1), "max_restarts", "between 0 and 100"),
    (_train(max_restarts=MAX_RETRIES + 1), "max_restarts", "between 0 and 100"),
    (_train(max_restarts=False), "max_restarts", "expected an integer"),
    (_train(restart={"max_retries": 2}), "restart.max_retries", "use max_restarts"),
    (_spark([{"role": "worker"}, {"role": "driver"}]), "tasks[1].command", "required"),
    (_spark([{"role": "worker"}, DRIVER, {"role": "exec", "command": "y"}]),
     "tasks[2].role", "a spark job's roles are master, worker, driver; got 'exec'"),
    (_spark([DRIVER]), "tasks", "needs a `worker` group"),
    (_spark([{"role": "worker"}]), "tasks", "needs a `driver` group"),
    (_spark([{"role": "master", "count": 2}, {"role": "worker"}, DRIVER]),
     "tasks[0].count", "a spark job has one master, got 2"),
    (_spark([{"role": "worker"}, {"role": "driver", "command": "x", "count": 3}]),
     "tasks[1].count", "a spark job has one driver, got 3"),
    (_spark([{"role": "worker", "count": 2}, {"role": "driver", "command": "x"}], workers=4),
     "tasks[0].count", "must equal workers (4)"),
    (_spark(workers=MAX_TASKS), "workers", "MAX_TASKS"),
    (_group(ports="metrics"), "tasks[1].ports", "expected a list of port names"),
    (_group(ports={"a": 1}), "tasks[1].ports", "expected a list of port names"),
    (_group(ports=[f"p{i}" for i in range(MAX_PORTS + 1)]), "tasks[1].ports", "at most 16 ports"),
    (_group(ports=["ok", "Metrics"]), "tasks[1].ports[1]", "a port name is a-z"),
    (_group(ports=["1st"]), "tasks[1].ports[0]", "a port name is a-z"),
    (_group(ports=[""]), "tasks[1].ports[0]", "a port name is a-z"),
    (_group(ports=["a" * 33]), "tasks[1].ports[0]", "a port name is a-z"),
    (_group(ports=["a.b"]), "tasks[1].ports[0]", "a port name is a-z"),
    (_group(ports=[5]), "tasks[1].ports[0]", "a port name is a-z"),
    (_group(ports=["m", "n", "m"]), "tasks[1].ports[2]", "'m' is named twice"),
]  # fmt: skip


@pytest.mark.parametrize(("source", "field", "problem"), BAD)
def test_validation_errors(source, field, problem):
    err = _error(source)
    assert err.field == field, str(err)
    assert problem in err.problem, str(err)
    assert str(err) == f"{field}: {err.problem}"


def test_an_unknown_framework_names_every_choice():
    err = _error(_train("jax"))
    for name in FRAMEWORKS:
        assert name in err.problem


def test_yaml_nulls_are_not_given():
    spec = parse_job_spec(
        "name: t\nframework: mpi\nworkers: null\nslots_per_node: null\nmax_restarts: null\n"
        "min_tasks: null\ntasks:\n  - {role: w, command: x, count: 2, ports: null}\n"
    )
    assert spec.tasks[0].count == 2 and spec.tasks[0].ports == ()
    assert (spec.slots_per_node, spec.max_restarts) == (1, 3)


def test_a_command_torchrun_cannot_run_is_refused_at_submit():
    err = _error(_train("pytorch", [{**WORKER, "command": ["torchrun", "train.py"]}]))
    assert err.field == "tasks[0].command" and "Mesh runs torchrun" in str(err)
    err = _error(_train("pytorch-elastic", [{**WORKER, "command": ["python", "-X", "dev"]}]))
    assert err.field == "tasks[0].command"
