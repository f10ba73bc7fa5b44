"""Model specs: validation with clear errors, and the ordinary job that serves a model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.executor import TASK_IDENTITIES
from mesh import subjects
from workloads.model import (
    GPU_TYPE_LABEL,
    MODEL_LABEL,
    TASK_IDENTITY_VAR,
    WORKER_IDENTITY,
    WORKER_ROLE,
    DeclaredProfile,
    declared_profile,
    model_job,
    parse_model_spec,
    worker_command,
)
from workloads.quantity import SpecError
from workloads.spec import parse_job_spec

Mi, Gi = 2**20, 2**30


def flag(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_minimal_cpu_model_and_its_job():
    spec = parse_model_spec("name: mlp\nmemory: 64Mi\nreplicas: 2\n")
    assert (spec.runtime, spec.slo_ms, spec.max_batch, spec.memory) == ("numpy", 100.0, 64, 64 * Mi)
    # A CPU replica holds the model in host memory, beside the runtime's own.
    assert spec.resources.memory == 64 * Mi + 256 * Mi and spec.resources.gpu == 0
    assert spec.resources.cpu == 500
    job = model_job(spec)
    assert parse_job_spec(job.to_dict()) == job  # the coordinator reads back the same job
    (group,) = job.tasks
    assert group.role == WORKER_ROLE and group.count == 2
    assert dict(group.env) == {TASK_IDENTITY_VAR: WORKER_IDENTITY}
    assert group.command[:3] == ("python", "-m", "inference.worker")
    argv = group.command
    assert flag(argv, "--model") == "mlp" and flag(argv, "--runtime") == "numpy"
    assert flag(argv, "--max-batch") == "64" and float(flag(argv, "--slo-ms")) == 100.0
    assert flag(argv, "--memory-bytes") == str(64 * Mi)
    assert flag(argv, "--gpu-type") == "cpu"
    assert "--a-ms" not in argv  # no profile declared: the worker fits its own
    assert "--nats" not in argv and "--worker-id" not in argv  # from the task's env
    assert dict(job.labels) == {MODEL_LABEL: "mlp"}
    assert not job.placement.gang  # replicas are placed as they fit, one by one
    assert job.restart.max_retries == 3 and job.max_run_time_s is None


def test_gpu_model_pinned_to_a_type_uses_its_declared_profile():
    spec = parse_model_spec(
        {
            "name": "resnet50",
            "runtime": "profile",
            "memory": "2Gi",
            "slo_ms": 50,
            "max_batch": 32,
            "replicas": 3,
            "min_replicas": 1,
            "resources": {"gpu": 0.25, "cpu": "1"},
            "gpu_type": "V100",
            "profiles": {"V100": {"a_ms": 5.2, "b_ms": 1.08}, "T4": {"a_ms": 9, "b_ms": 2}},
            "pool": "/ml",
            "priority": 7,
            "labels": {"team": "vision"},
            "placement": {"labels": {"zone": "a"}, "strategy": "spread"},
        }
    )
    r = spec.resources
    assert (r.gpu, r.gpu_memory, r.cpu, r.memory) == (250, 2 * Gi, 1000, 256 * Mi)
    assert declared_profile(spec) == ("V100", DeclaredProfile(5.2, 1.08))
    job = model_job(spec)
    assert parse_job_spec(job.to_dict()) == job
    argv = job.tasks[0].command
    assert flag(argv, "--a-ms") == "5.2" and flag(argv, "--b-ms") == "1.08"
    assert flag(argv, "--gpu-type") == "V100"
    assert dict(job.placement.labels) == {"zone": "a", GPU_TYPE_LABEL: "V100"}
    assert job.placement.strategy == "spread"
    assert (job.pool, job.priority, job.min_tasks) == ("/ml", 7, 1)
    assert dict(job.labels) == {"team": "vision", MODEL_LABEL: "resnet50"}
    assert job.tasks[0].resources == r


def test_gpu_model_of_unknown_type_starts_from_the_workers_defaults():
    spec = parse_model_spec(
        "name: m\nmemory: 1Gi\nresources: {gpu: 1, gpu_memory: 4Gi}\n"
        "profiles: {A100: {a_ms: 1, b_ms: 0.5}}\n"
    )
    assert declared_profile(spec) is None  # any GPU type may be chosen at placement
    argv = worker_command(spec)
    assert "--a-ms" not in argv and "--gpu-type" not in argv
    assert spec.resources.gpu_memory == 4 * Gi


def test_gang_only_when_asked():
    spec = parse_model_spec("name: m\nmemory: 1Mi\nplacement: {gang: true}\n")
    assert model_job(spec).placement.gang


def test_the_marker_is_the_one_the_agent_honours():
    assert WORKER_IDENTITY in TASK_IDENTITIES


@given(st.from_regex(r"[a-z0-9][a-z0-9_-]{0,39}", fullmatch=True))
def test_every_valid_name_is_a_subject_token_and_a_job_name(name):
    spec = parse_model_spec({"name": name, "memory": "1Mi"})
    assert subjects.token(spec.name) == name
    job = model_job(spec)
    assert parse_job_spec(job.to_dict()) == job


@given(
    replicas=st.integers(1, 50),
    max_batch=st.integers(1, 1024),
    slo=st.floats(0.01, 3_600_000, allow_nan=False),
    a=st.floats(0, 1000, allow_nan=False),
    b=st.floats(0.001, 1000, allow_nan=False),
)
def test_numbers_reach_the_worker_exactly(replicas, max_batch, slo, a, b):
    spec = parse_model_spec(
        {
            "name": "m",
            "memory": 1,
            "replicas": replicas,
            "max_batch": max_batch,
            "slo_ms": slo,
            "profiles": {"cpu": {"a_ms": a, "b_ms": b}},
        }
    )
    argv = worker_command(spec)
    assert float(flag(argv, "--slo-ms")) == slo
    assert float(flag(argv, "--a-ms")) == a and float(flag(argv, "--b-ms")) == b
    assert int(flag(argv, "--max-batch")) == max_batch
    assert model_job(spec).tasks[0].count == replicas


BASE = {"name": "m", "memory": "1Gi"}


@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"name": None}, "name", "required"),
        ({"name": "My.Model"}, "name", "use a-z"),
        ({"name": "a" * 41}, "name", "at most 40"),
        ({"name": 3}, "name", "expected a string"),
        ({"memory": None}, "memory", "required"),
        ({"memory": "0"}, "memory", "more than 0"),
        ({"memory": "lots"}, "memory", "expected"),
        ({"runtime": "tensorflow"}, "runtime", "numpy, profile, torch"),
        ({"slo_ms": 0}, "slo_ms", "more than 0"),
        ({"slo_ms": "fast"}, "slo_ms", "milliseconds"),
        ({"slo_ms": float("inf")}, "slo_ms", "at most"),
        ({"max_batch": 0}, "max_batch", "between 1 and 1024"),
        ({"max_batch": 2000}, "max_batch", "between 1 and 1024"),
        ({"replicas": 0}, "replicas", "between 1"),
        ({"replicas": 2, "min_replicas": 3}, "min_replicas", "between 1 and 2"),
        ({"resources": {"cpu": 0}}, "resources.cpu", "more than 0"),
        ({"resources": {"gpu": 2.5}}, "resources.gpu", "whole"),
        ({"resources": {"gpu_memory": "1Gi"}}, "resources.gpu_memory", "gpu request"),
        ({"resources": {"memory": "512Mi"}}, "resources.memory", "less than the model's"),
        (
            {"resources": {"gpu": 0.5, "gpu_memory": "512Mi"}},
            "resources.gpu_memory",
            "less than the model's",
        ),
        ({"resources": {"cpus": 1}}, "resources.cpus", "unknown field"),
        ({"gpu_type": "A100"}, "gpu_type", "GPU request"),
        ({"gpu_type": "a b", "resources": {"gpu": 1}}, "gpu_type", "GPU type"),
        ({"profiles": [1]}, "profiles", "mapping"),
        ({"profiles": {"cpu": {"a_ms": 1}}}, "profiles.cpu.b_ms", "required"),
        ({"profiles": {"cpu": {"a_ms": -1, "b_ms": 1}}}, "profiles.cpu.a_ms", "at least 0"),
        ({"profiles": {"cpu": {"a_ms": 0, "b_ms": 0}}}, "profiles.cpu", "both 0"),
        ({"profiles": {"cpu": {"a_ms": 1, "b_ms": 1, "c_ms": 1}}}, "profiles.cpu.c_ms", "unknown"),
        ({"runtime": "profile"}, "profiles", "declared profile"),
        (
            {
                "runtime": "profile",
                "resources": {"gpu": 1},
                "profiles": {"cpu": {"a_ms": 1, "b_ms": 1}},
            },
            "profiles",
            "gpu_type",
        ),
        (
            {
                "gpu_type": "A100",
                "resources": {"gpu": 1},
                "placement": {"labels": {"gpu_type": "T4"}},
            },
            "placement.labels.gpu_type",
            "contradicts",
        ),
        ({"placement": {"gang": "yes"}}, "placement.gang", "true or false"),
        ({"placement": {"strategy": "random"}}, "placement.strategy", "binpack"),
        ({"pool": "ml"}, "pool", "path"),
        ({"priority": 5000}, "priority", "MAX_PRIORITY"),
        ({"preemptible": "no"}, "preemptible", "true or false"),
        ({"labels": {MODEL_LABEL: "x"}}, f"labels.{MODEL_LABEL}", "set by Mesh"),
        ({"labels": {f"k{i}": "v" for i in range(32)}}, "labels", "at most 31"),
        ({"max_retries": -1}, "max_retries", "between 0"),
        ({"replica": 2}, "replica", "unknown field"),
    ],
)
def test_bad_specs_say_which_field_and_why(change, field, words):
    data = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    with pytest.raises(SpecError) as err:
        parse_model_spec(data)
    assert err.value.field == field, err.value
    assert words in err.value.problem, err.value


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "empty"),
        ("- a\n- b\n", "expected a mapping"),
        ("name: m\nname: n\nmemory: 1Mi\n", "duplicate key"),
        ("name: [unclosed\n", "invalid YAML"),
    ],
)
def test_bad_yaml(text, words):
    with pytest.raises(SpecError, match=words):
        parse_model_spec(text)


def test_the_docs_model_specs_parse():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    blocks = []
    for doc in ("README.md", "docs/inference_deploy.md"):
        text = (root / doc).read_text()
        blocks += [
            b
            for b in re.findall(r"```yaml\n(.*?)```", text, re.S)
            if "max_batch:" in b  # a model spec, not a job spec
        ]
    assert len(blocks) == 2
    for block in blocks:
        job = model_job(parse_model_spec(block))
        assert parse_job_spec(job.to_dict()) == job
