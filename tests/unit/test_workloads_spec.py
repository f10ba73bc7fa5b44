"""Job specs (workloads.spec): parsing, validation, limits and the to_dict round trip."""

from __future__ import annotations

import string
from dataclasses import replace

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workloads import (
    JobSpec,
    Resources,
    RestartPolicy,
    SimulatedRun,
    SpecError,
    TaskGroup,
    parse_job_spec,
)
from workloads.load import LoadCurve
from workloads.spec import (
    DEFAULT_CPU,
    DEFAULT_MEMORY,
    MAX_COMMAND_BYTES,
    MAX_ENV_BYTES,
    MAX_ENV_ENTRIES,
    MAX_LABEL_KEY_LEN,
    MAX_LABEL_VALUE_LEN,
    MAX_LABELS,
    MAX_NAME_LEN,
    MAX_POOL_DEPTH,
    MAX_SOURCE_BYTES,
    MAX_TASKS,
    MAX_WORKDIR_LEN,
)
from workloads.training import FRAMEWORKS

Mi, Gi = 2**20, 2**30

FULL = """
name: resnet.train-1
pool: /ml/vision
priority: 500
max_run_time: 2h
restart:
  max_retries: 3
  reschedule_on_lost: false
labels:
  team: vision
  build: 42
tasks:
  - role: ps
    command: ["python", "-m", "ps", "--port", 2222]
    env: {ZETA: z, ALPHA: "1", PORT: 2222, RATIO: 0.5}
    workdir: /srv/job
    resources: {cpu: 2, memory: 4Gi, disk: 10Gi}
  - role: worker
    count: 8
    command: python train.py --epochs 10
    resources: {cpu: 500m, memory: 8Gi, gpu: 0.5, gpu_memory: 20Gi}
  - role: sim
    count: 2
    simulate: {duration: 30s, exit_code: 3}
"""


def test_full_example():
    spec = parse_job_spec(FULL)
    assert spec == JobSpec(
        name="resnet.train-1",
        pool="/ml/vision",
        priority=500,
        max_run_time_s=7200.0,
        restart=RestartPolicy(max_retries=3, reschedule_on_lost=False),
        labels=(("build", "42"), ("team", "vision")),
        tasks=(
            TaskGroup(
                role="ps",
                command=("python", "-m", "ps", "--port", "2222"),
                env=(("ALPHA", "1"), ("PORT", "2222"), ("RATIO", "0.5"), ("ZETA", "z")),
                workdir="/srv/job",
                resources=Resources(cpu=2000, memory=4 * Gi, disk=10 * Gi),
            ),
            TaskGroup(
                role="worker",
                count=8,
                command=("/bin/sh", "-c", "python train.py --epochs 10"),
                resources=Resources(cpu=500, memory=8 * Gi, gpu=500, gpu_memory=20 * Gi),
            ),
            TaskGroup(
                role="sim",
                count=2,
                simulate=SimulatedRun(duration_s=30.0, exit_code=3),
                resources=Resources(cpu=DEFAULT_CPU, memory=DEFAULT_MEMORY),
            ),
        ),
    )
    assert spec.task_count == 11
    assert spec.total_resources == Resources(
        cpu=2000 + 8 * 500 + 2 * 100,
        memory=4 * Gi + 64 * Gi + 2 * 64 * Mi,
        disk=10 * Gi,
        gpu=4000,
        gpu_memory=160 * Gi,
    )
    assert parse_job_spec(spec.to_dict()) == spec


def test_bytes_and_mapping_sources():
    spec = parse_job_spec(FULL)
    assert parse_job_spec(FULL.encode()) == spec
    assert parse_job_spec(yaml.safe_load(FULL)) == spec


def test_defaults():
    spec = parse_job_spec("name: j\ntasks: [{role: main, command: 'true'}]")
    assert spec.pool == "/"
    assert spec.priority == 0
    assert spec.max_run_time_s is None
    assert spec.restart == RestartPolicy(max_retries=0, reschedule_on_lost=True)
    assert spec.labels == ()
    (group,) = spec.tasks
    assert group.count == 1
    assert group.env == ()
    assert group.workdir is None
    assert group.simulate is None
    assert group.resources == Resources(cpu=100, memory=64 * Mi)


def test_default_applies_per_kind_and_explicit_zero_is_kept():
    spec = parse_job_spec(
        "name: j\ntasks:\n"
        "  - {role: a, command: x, resources: {gpu: 1}}\n"
        "  - {role: b, command: x, resources: {cpu: 0, memory: 0}}\n"
        "  - {role: c, command: x, resources: {cpu: 2}}\n"
    )
    a, b, c = (g.resources for g in spec.tasks)
    assert a == Resources(cpu=100, memory=64 * Mi, gpu=1000)
    assert b == Resources()
    assert c == Resources(cpu=2000, memory=64 * Mi)


def test_null_means_not_given():
    spec = parse_job_spec("name: j\npool:\nlabels:\ntasks: [{role: a, command: x, env: , count: }]")
    assert spec.pool == "/" and spec.labels == ()
    assert spec.tasks[0].env == () and spec.tasks[0].count == 1


def test_string_command_runs_under_sh():
    spec = parse_job_spec("name: j\ntasks: [{role: a, command: 'echo $HOME && ls'}]")
    assert spec.tasks[0].command == ("/bin/sh", "-c", "echo $HOME && ls")


def test_list_command_is_argv_as_is():
    spec = parse_job_spec("name: j\ntasks: [{role: a, command: [ls, '-l', '$HOME', 3]}]")
    assert spec.tasks[0].command == ("ls", "-l", "$HOME", "3")


def test_env_sorted_and_coerced():
    spec = parse_job_spec(
        "name: j\ntasks: [{role: a, command: x, env: {b: 2, A: x, _c: 1.5, D: ''}}]"
    )
    assert spec.tasks[0].env == (("A", "x"), ("D", ""), ("_c", "1.5"), ("b", "2"))


def test_simulate_without_command():
    spec = parse_job_spec("name: j\ntasks: [{role: a, simulate: {duration: 90}}]")
    assert spec.tasks[0].command == ()
    assert spec.tasks[0].simulate == SimulatedRun(duration_s=90.0, exit_code=0)
    assert parse_job_spec(spec.to_dict()) == spec
    assert "stop" not in spec.to_dict()["tasks"][0]["simulate"]  # as before stop existed


def test_a_simulated_run_may_take_time_to_stop():
    spec = parse_job_spec("name: j\ntasks: [{role: a, simulate: {duration: forever, stop: 4s}}]")
    assert spec.tasks[0].simulate == SimulatedRun(duration_s=None, stop_s=4.0)
    assert spec.tasks[0].simulate.stop_s == 4.0
    assert parse_job_spec(spec.to_dict()) == spec


def test_to_dict_is_plain_data():
    def check(value):
        if isinstance(value, dict):
            for k, v in value.items():
                assert isinstance(k, str)
                check(v)
        elif isinstance(value, list):
            for v in value:
                check(v)
        else:
            assert value is None or isinstance(value, str | int | float | bool)

    data = parse_job_spec(FULL).to_dict()
    check(data)
    # Plain data survives a YAML dump and reload, too.
    assert parse_job_spec(yaml.safe_dump(data)) == parse_job_spec(FULL)


# --------------------------------------------------------------------------- errors


def _job(**fields) -> dict:
    base = {"name": "j", "tasks": [{"role": "a", "command": "x"}]}
    base.update(fields)
    return base


def _group(**fields) -> dict:
    group = {"role": "a", "command": "x"}
    group.update(fields)
    return _job(tasks=[group])


def _error(source) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_job_spec(source)
    return info.value


BAD = [
    # (spec, field, words in the problem)
    ({"tasks": [{"role": "a", "command": "x"}]}, "name", "required"),
    (_job(name=""), "name", "use a-z"),
    (_job(name="Big"), "name", "use a-z"),
    (_job(name="-x"), "name", "use a-z"),
    (_job(name=5), "name", "expected a string"),
    (_job(name="a" * (MAX_NAME_LEN + 1)), "name", "MAX_NAME_LEN"),
    (_job(pool="ml"), "pool", "expected '/' or a path"),
    (_job(pool="/ml/"), "pool", "expected '/' or a path"),
    (_job(pool="/ML"), "pool", "expected '/' or a path"),
    (_job(pool="//"), "pool", "expected '/' or a path"),
    (_job(pool="/" + "a" * 33), "pool", "expected '/' or a path"),
    (_job(pool="/a" * (MAX_POOL_DEPTH + 1)), "pool", "MAX_POOL_DEPTH"),
    (_job(priority=-1), "priority", "between 0 and 1000"),
    (_job(priority=1001), "priority", "MAX_PRIORITY"),
    (_job(priority=True), "priority", "expected an integer"),
    (_job(priority="5"), "priority", "expected an integer"),
    (_job(priority=1.0), "priority", "expected an integer"),
    (_job(max_run_time="soon"), "max_run_time", "expected a duration"),
    (_job(max_run_time=0), "max_run_time", "more than 0"),
    (_job(max_run_time="-1h"), "max_run_time", "negative"),
    (_job(restart=[]), "restart", "expected a mapping"),
    (_job(restart={"max_retries": 101}), "restart.max_retries", "MAX_RETRIES"),
    (_job(restart={"max_retries": -1}), "restart.max_retries", "between 0 and 100"),
    (_job(restart={"reschedule_on_lost": "yes"}), "restart.reschedule_on_lost", "true or false"),
    (
        _job(restart={"retries": 1}),
        "restart.retries",
        "unknown field (known: backoff, max_backoff, max_retries",
    ),
    (_job(labels=["a"]), "labels", "expected a mapping"),
    (_job(labels={"a": [1]}), "labels.a", "expected a string"),
    (_job(labels={"a": True}), "labels.a", "expected a string"),
    (_job(labels={1: "x"}), "labels", "must be strings"),
    (_job(labels={"bad key": "x"}), "labels.bad key", "label names use"),
    (
        _job(labels={"k" * (MAX_LABEL_KEY_LEN + 1): "x"}),
        "labels." + "k" * MAX_LABEL_KEY_LEN,
        "MAX_LABEL_KEY_LEN",
    ),
    (_job(labels={"k": "v" * (MAX_LABEL_VALUE_LEN + 1)}), "labels.k", "MAX_LABEL_VALUE_LEN"),
    (_job(labels={f"k{i}": "v" for i in range(MAX_LABELS + 1)}), "labels", "MAX_LABELS"),
    (_job(tasks=[]), "tasks", "a job needs at least one task group"),
    ({"name": "j"}, "tasks", "a job needs at least one task group"),
    (_job(tasks={"role": "a"}), "tasks", "expected a list"),
    (_job(tasks=["x"]), "tasks[0]", "expected a mapping, got a string"),
    (
        _job(bogus=1),
        "bogus",
        "unknown field (known: framework, health, kind, labels, lost_after, max_restarts, "
        "max_run_time, min_tasks, name",
    ),
    (
        _group(bogus=1),
        "tasks[0].bogus",
        "unknown field (known: command, count, env, ports, resources, role, simulate, workdir)",
    ),
    ({"name": "j", "tasks": [{"command": "x"}]}, "tasks[0].role", "required"),
    (_group(role="Worker"), "tasks[0].role", "use a-z"),
    (_group(role="r" * 33), "tasks[0].role", "MAX_ROLE_LEN"),
    (
        _job(tasks=[{"role": "a", "command": "x"}, {"role": "a", "command": "y"}]),
        "tasks[1].role",
        "duplicate role 'a'",
    ),
    (_group(count=0), "tasks[0].count", "between 1 and 10000"),
    (_group(count=10_001), "tasks[0].count", "MAX_COUNT"),
    (_group(count="2"), "tasks[0].count", "expected an integer"),
    ({"name": "j", "tasks": [{"role": "a"}]}, "tasks[0].command", "required"),
    (_group(command=""), "tasks[0].command", "must not be empty"),
    (_group(command=[]), "tasks[0].command", "must not be empty"),
    (_group(command=["", "x"]), "tasks[0].command[0]", "program must not be empty"),
    (_group(command=["ls", ["x"]]), "tasks[0].command[1]", "expected a string"),
    (_group(command=["ls", None]), "tasks[0].command[1]", "expected a string"),
    (_group(command=["ls", "a\x00b"]), "tasks[0].command[1]", "NUL"),
    (_group(command={"a": 1}), "tasks[0].command", "expected a string or a list"),
    (_group(env=["A=1"]), "tasks[0].env", "expected a mapping"),
    (_group(env={"1A": "x"}), "tasks[0].env", "variable names use"),
    (_group(env={"A-B": "x"}), "tasks[0].env", "variable names use"),
    (_group(env={"A": [1]}), "tasks[0].env.A", "expected a string"),
    (_group(env={"A": False}), "tasks[0].env.A", "expected a string"),
    (_group(env={"A": "\x00"}), "tasks[0].env.A", "NUL"),
    (_group(workdir="rel/path"), "tasks[0].workdir", "absolute path"),
    (_group(workdir=3), "tasks[0].workdir", "expected a string"),
    (_group(workdir="/" + "d" * MAX_WORKDIR_LEN), "tasks[0].workdir", "MAX_WORKDIR_LEN"),
    (
        _group(resources={"memory": "lots"}),
        "tasks[0].resources.memory",
        "expected a quantity like 64Mi or 2Gi, got 'lots'",
    ),
    (_group(resources={"cpu": "-1"}), "tasks[0].resources.cpu", "negative"),
    (_group(resources={"disk": "1X"}), "tasks[0].resources.disk", "expected a quantity"),
    (_group(resources={"gpu": 1.5}), "tasks[0].resources.gpu", "fractional GPUs must be below 1"),
    (_group(resources={"gpu_memory": "8Gi"}), "tasks[0].resources.gpu_memory", "needs a gpu"),
    (_group(resources={"ram": "1Gi"}), "tasks[0].resources.ram", "unknown field"),
    (_group(resources="big"), "tasks[0].resources", "expected a mapping"),
    (_group(simulate={}), "tasks[0].simulate.duration", "required"),
    (_group(simulate={"duration": "x"}), "tasks[0].simulate.duration", "expected a duration"),
    (
        _group(simulate={"duration": 1, "exit_code": 256}),
        "tasks[0].simulate.exit_code",
        "between 0 and 255",
    ),
    (_group(simulate={"duration": 1, "exit": 1}), "tasks[0].simulate.exit", "unknown field"),
    (_group(simulate=30), "tasks[0].simulate", "expected a mapping"),
    (_group(simulate={"duration": 1, "stop": "-1s"}), "tasks[0].simulate.stop", "negative"),
    (_group(simulate={"duration": 1, "stop": "2h"}), "tasks[0].simulate.stop", "at most 3600s"),
]


@pytest.mark.parametrize(("source", "field", "problem"), BAD)
def test_validation_errors(source, field, problem):
    err = _error(source)
    assert err.field == field, str(err)
    assert problem in err.problem, str(err)
    assert str(err) == f"{field}: {err.problem}"


def test_error_path_names_the_right_group():
    err = _error(
        "name: j\ntasks:\n  - {role: a, command: x}\n  - {role: b, command: y, "
        "resources: {memory: lots}}\n"
    )
    assert str(err) == "tasks[1].resources.memory: expected a quantity like 64Mi or 2Gi, got 'lots'"


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("name: j\ntasks: }\npool: /\n", "invalid YAML: line 2"),
        ("name: j\ntasks: [", "invalid YAML: line "),
        ("name: j\nname: k\ntasks: []", "invalid YAML: line 2: found duplicate key 'name'"),
        ("name: j\n\ttasks: []", "invalid YAML: line 2"),
        ("[" * 10_000, "invalid YAML"),
        ("- a\n- b\n", "expected a mapping, got a list"),
        ("", "the spec is empty"),
        (b"\xff\xfe", "spec is not valid UTF-8"),
        (42, "expected YAML text, bytes or a mapping"),
    ],
)
def test_document_errors(source, problem):
    err = _error(source)
    assert err.field == ""
    assert str(err).startswith(problem), str(err)


def test_yaml_merge_keys_still_work():
    spec = parse_job_spec(
        "name: j\ntasks:\n  - &b {role: a, command: x, count: 2}\n  - {<<: *b, role: b}\n"
    )
    assert [(g.role, g.count) for g in spec.tasks] == [("a", 2), ("b", 2)]


# --------------------------------------------------------------------------- limits


def test_source_size_limit():
    big = "name: j\ntasks: [{role: a, command: x}]\n#" + "x" * MAX_SOURCE_BYTES
    for source in (big, big.encode()):
        err = _error(source)
        assert "MAX_SOURCE_BYTES" in str(err)
    # The limit is on UTF-8 bytes, not characters.
    wide = "name: j\ntasks: [{role: a, command: x}]\n#" + "é" * (MAX_SOURCE_BYTES // 2)
    assert "MAX_SOURCE_BYTES" in str(_error(wide))


def test_command_size_limit():
    ok = "x" * (MAX_COMMAND_BYTES - 1)
    assert parse_job_spec(_group(command=[ok])).tasks[0].command == (ok,)
    err = _error(_group(command=[ok, "y"]))
    assert err.field == "tasks[0].command" and "MAX_COMMAND_BYTES" in err.problem
    err = _error(_group(command="x" * MAX_COMMAND_BYTES))
    assert err.field == "tasks[0].command" and "MAX_COMMAND_BYTES" in err.problem
    err = _error(_group(command=["a"] * (MAX_COMMAND_BYTES + 1)))
    assert "MAX_COMMAND_BYTES" in err.problem


def test_env_limits():
    env = {f"V{i}": "x" for i in range(MAX_ENV_ENTRIES)}
    assert len(parse_job_spec(_group(env=env)).tasks[0].env) == MAX_ENV_ENTRIES
    env["ONE_MORE"] = "x"
    err = _error(_group(env=env))
    assert err.field == "tasks[0].env" and "MAX_ENV_ENTRIES" in err.problem
    err = _error(_group(env={"A": "x" * MAX_ENV_BYTES}))
    assert err.field == "tasks[0].env" and "MAX_ENV_BYTES" in err.problem


def test_task_count_limit():
    groups = [{"role": f"g{i}", "command": "x", "count": 5000} for i in range(2)]
    assert parse_job_spec(_job(tasks=groups)).task_count == MAX_TASKS
    groups.append({"role": "extra", "command": "x"})
    err = _error(_job(tasks=groups))
    assert err.field == "tasks" and "MAX_TASKS" in err.problem
    err = _error(_job(tasks=[{"role": "a", "command": "x"}] * (MAX_TASKS + 1)))
    assert err.field == "tasks" and "MAX_TASKS" in err.problem


def test_pool_depth_limit_is_inclusive():
    pool = "/a" * MAX_POOL_DEPTH
    assert parse_job_spec(_job(pool=pool)).pool == pool


def test_label_count_limit_is_inclusive():
    labels = {f"k{i}": str(i) for i in range(MAX_LABELS)}
    assert len(parse_job_spec(_job(labels=labels)).labels) == MAX_LABELS


def test_name_length_limit_is_inclusive():
    name = "a" * MAX_NAME_LEN
    assert parse_job_spec(_job(name=name)).name == name


# --------------------------------------------------------------------------- round trip

_LOWER = string.ascii_lowercase + string.digits
_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20
)


def _ident(first: str, rest: str, max_rest: int) -> st.SearchStrategy[str]:
    """Like st.from_regex(f"[{first}][{rest}]{{0,max_rest}}") but much cheaper to draw."""
    return st.builds(str.__add__, st.sampled_from(first), st.text(rest, max_size=max_rest))


_names = _ident(_LOWER, _LOWER + "_.-", 62)
_roles = _ident(_LOWER, _LOWER + "_-", 31)
_pools = st.one_of(
    st.just("/"),
    st.lists(st.text(_LOWER + "_-", min_size=1, max_size=32), min_size=1, max_size=8).map(
        lambda parts: "/" + "/".join(parts)
    ),
)
_durations = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
_env = st.dictionaries(
    _ident(string.ascii_letters + "_", string.ascii_letters + "_0123456789", 15), _text, max_size=5
).map(lambda d: tuple(sorted(d.items())))
_labels = st.dictionaries(
    _ident(string.ascii_letters + string.digits, string.ascii_letters + string.digits + "_./-", 20),
    st.text(max_size=30),
    max_size=5,
).map(lambda d: tuple(sorted(d.items())))


@st.composite
def _resources(draw) -> Resources:
    gpu = draw(
        st.one_of(st.just(0), st.integers(1, 1000), st.integers(1, 16).map(lambda n: n * 1000))
    )
    return Resources(
        cpu=draw(st.integers(0, 10**9)),
        memory=draw(st.integers(0, 2**60)),
        disk=draw(st.integers(0, 2**60)),
        gpu=gpu,
        gpu_memory=draw(st.integers(0, 2**40)) if gpu else 0,
    )


_levels = st.floats(0.0, 1.0)
_cores = st.none() | st.floats(0.0, 4096.0)
_year = st.floats(0.0, 366 * 86400.0)  # a curve's durations


@st.composite
def _loads(draw) -> LoadCurve:
    """A curve as the parser builds it: the fields of other curves at their defaults."""
    curve = draw(st.sampled_from(["flat", "diurnal", "step"]))
    peak, noise, cores, origin = draw(_levels), draw(_levels), draw(_cores), draw(_durations)
    if curve == "flat":
        return LoadCurve("flat", peak, cores=cores, noise=noise, step_to=peak, origin=origin)
    trough = draw(st.floats(0.0, peak))
    if curve == "diurnal":
        period = draw(_year.filter(lambda d: d > 0))
        phase = draw(_year)
        return LoadCurve("diurnal", peak, trough, period, phase, cores, noise, 0.0, peak, origin)
    step_at = draw(_year)
    return LoadCurve(
        "step", peak, trough, cores=cores, noise=noise, step_at_s=step_at,
        step_to=draw(_levels), origin=origin,
    )  # fmt: skip


_stops = st.just(0.0) | st.floats(min_value=0, max_value=3600, allow_nan=False)
_simulated = st.one_of(
    st.builds(SimulatedRun, _durations, st.integers(0, 255), st.none() | _loads(), _stops),
    st.builds(SimulatedRun, st.none(), st.just(0), st.none() | _loads(), _stops),  # forever
)


_ports = st.lists(_ident(string.ascii_lowercase, _LOWER + "_-", 31), max_size=16, unique=True)


@st.composite
def _task_groups(draw, role: str, commandless: bool = False) -> TaskGroup:
    simulate = draw(st.one_of(st.none(), _simulated))
    command = draw(
        st.one_of(
            st.tuples(st.text(min_size=1, max_size=10).filter(lambda s: "\x00" not in s)),
            st.lists(_text, min_size=1, max_size=4).map(lambda a: ("prog", *a)),
            st.text(max_size=30)
            .filter(lambda s: s.strip() and "\x00" not in s)
            .map(lambda s: ("/bin/sh", "-c", s)),
            *([st.just(())] if simulate is not None or commandless else []),
        )
    )
    return TaskGroup(
        role=role,
        count=draw(st.integers(1, 100)),
        command=command,
        env=draw(_env),
        resources=draw(_resources()),
        simulate=simulate,
        workdir=draw(st.one_of(st.none(), _text.map(lambda s: "/" + s))),
        ports=tuple(draw(_ports)),
    )


@st.composite
def _training(draw, roles: list[str]) -> dict:
    """The training fields (workloads/training.py) and groups of a valid spec: a batch job
    as before, one worker group for most frameworks, a master, workers and driver for spark."""
    framework = draw(st.sampled_from(FRAMEWORKS))
    if framework == "batch":
        return {"tasks": tuple(draw(_task_groups(role)) for role in roles)}
    fields = {
        "framework": framework,
        "slots_per_node": draw(st.integers(1, 256)),
        "max_restarts": draw(st.integers(0, 100)),
    }
    if framework == "spark":
        spark_roles = draw(st.permutations(["master", "worker", "driver"]))
        groups = [draw(_task_groups(r, commandless=r != "driver")) for r in spark_roles]
        groups = [g if g.role == "worker" else replace(g, count=1) for g in groups]
        groups = [  # room for a worker's or a driver's JVM (workloads/spark_memory.py)
            replace(g, resources=replace(g.resources, memory=max(g.resources.memory, 2**31)))
            if g.role != "master"
            else g
            for g in groups
        ]
        return {**fields, "tasks": tuple(groups)}
    group = draw(_task_groups(roles[0]))
    if framework in ("pytorch-elastic", "horovod-elastic") and draw(st.booleans()):
        low = draw(st.integers(1, group.count - 1)) if group.count > 1 else None
        if low is not None:
            fields.update(workers_min=low, workers_max=group.count, min_tasks=low)
    return {**fields, "tasks": (group,)}


@st.composite
def _specs(draw) -> JobSpec:
    roles = draw(st.lists(_roles, min_size=1, max_size=4, unique=True))
    training = draw(_training(roles))
    batch = training.get("framework", "batch") == "batch"
    return JobSpec(
        name=draw(_names),
        pool=draw(_pools),
        priority=draw(st.integers(0, 1000)),
        max_run_time_s=draw(st.one_of(st.none(), _durations.filter(lambda d: d > 0))),
        restart=RestartPolicy(draw(st.integers(0, 100)) if batch else 0, draw(st.booleans())),
        labels=draw(_labels),
        **training,
    )


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(_specs())
def test_round_trip(spec):
    assert parse_job_spec(spec.to_dict()) == spec
    total = Resources()
    for group in spec.tasks:
        for _ in range(group.count):
            total = total + group.resources
    assert spec.total_resources == total
    assert spec.task_count == sum(g.count for g in spec.tasks)


# --------------------------------------------------------------------------- the package


def test_public_api_is_pinned():
    import workloads

    assert sorted(workloads.__all__) == sorted(
        [
            "ENDED", "FINAL", "TRANSITIONS", "IllegalTransition", "JobSpec", "JobState",
            "Resources", "RestartPolicy", "SimulatedRun", "SpecError", "TaskGroup", "TaskState",
            "can_transition", "check_transition", "format_bytes", "format_cpu", "format_gpu",
            "job_state", "parse_bytes", "parse_cpu", "parse_duration", "parse_gpu",
            "parse_job_spec",
        ]
    )  # fmt: skip
    for name in workloads.__all__:
        assert hasattr(workloads, name)


def test_workloads_imports_only_stdlib_and_yaml():
    """The vocabulary is the bottom layer: nothing of Mesh beneath it."""
    import ast
    import pathlib
    import sys

    import workloads

    allowed = set(sys.stdlib_module_names) | {"yaml", "workloads"}
    for path in pathlib.Path(workloads.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"


def test_preemptible_and_min_tasks():
    base = {"name": "e", "tasks": [{"role": "w", "count": 4, "command": "true"}]}
    spec = parse_job_spec({**base, "preemptible": False, "min_tasks": 2})
    assert spec.preemptible is False and spec.min_tasks == 2
    assert parse_job_spec(spec.to_dict()) == spec
    assert parse_job_spec(base).preemptible is True and parse_job_spec(base).min_tasks is None
    with pytest.raises(SpecError, match="preemptible: expected true or false"):
        parse_job_spec({**base, "preemptible": "no"})
    with pytest.raises(SpecError, match="min_tasks: must be between 1 and 4"):
        parse_job_spec({**base, "min_tasks": 5})
    mixed = {
        **base,
        "min_tasks": 1,
        "tasks": [
            {"role": "a", "command": "true", "resources": {"cpu": 1}},
            {"role": "b", "command": "true", "resources": {"cpu": 2}},
        ],
    }
    with pytest.raises(SpecError, match="min_tasks: an elastic job's task groups"):
        parse_job_spec(mixed)


def _outcome(parse, value, path):
    try:
        return parse(value, path)
    except SpecError as exc:
        return ("error", str(exc))


_quantities = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.sampled_from(["1", "0.5", "500m", "4Gi", "1.5Gi", "2G", "-1", " 3 ", "0x10", "1e3", ""]),
    st.text(max_size=8),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["cpu", "memory", "disk", "gpu", "gpu_memory", "bogus"]),
            _quantities,
            max_size=5,
        ),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from(["tasks[0].resources", "tasks[3].resources"]),
)
def test_resources_and_labels_parsed_once_give_what_a_fresh_parse_gives(mappings, path):
    """Equal requests are parsed once and the result reused: every mapping, asked in any
    order and again, gives what parsing it afresh gives, errors and their paths included
    (1, 1.0 and True are told apart: True is no quantity)."""
    from workloads import spec as s

    for value in mappings + mappings[::-1]:
        assert _outcome(s._resources, value, path) == _outcome(s._parse_resources, value, path)
        labels = {k.replace("_", "-"): v for k, v in value.items()}
        assert _outcome(s._labels, labels, "labels") == _outcome(s._parse_labels, labels, "labels")


def test_a_cached_request_does_not_hide_an_equal_looking_bad_one():
    from workloads import spec as s

    assert s._resources({"cpu": 1}, "r") == Resources(cpu=1000, memory=DEFAULT_MEMORY)
    assert s._resources({"cpu": 1.0}, "r") == Resources(cpu=1000, memory=DEFAULT_MEMORY)
    with pytest.raises(SpecError, match="r.cpu"):
        s._resources({"cpu": True}, "r")
    with pytest.raises(SpecError, match="r.gpu_memory"):
        s._resources({"gpu_memory": "1Gi"}, "r")
    with pytest.raises(SpecError, match="q.gpu_memory"):  # the path is the caller's
        s._resources({"gpu_memory": "1Gi"}, "q")


def test_kept_labels_tell_minus_zero_from_zero():
    """-0.0 == 0.0, but as a label it reads differently: the kept parse must not mix them
    (hypothesis found it; the cache key compared them equal)."""
    from workloads import spec as s

    assert s._labels({"disk": 0.0}, "labels") == (("disk", "0.0"),)
    assert s._labels({"disk": -0.0}, "labels") == (("disk", "-0.0"),)
