"""Mesh's vocabulary: resources, job specs and the task lifecycle.

Pure data and validation, importing nothing else of Mesh (only the standard library and
PyYAML), so every other package can stand on it. See README.md beside this file.
"""

from workloads.lifecycle import (
    ENDED,
    FINAL,
    TRANSITIONS,
    IllegalTransition,
    JobState,
    TaskState,
    can_transition,
    check_transition,
    job_state,
)
from workloads.quantity import (
    SpecError,
    format_bytes,
    format_cpu,
    format_gpu,
    parse_bytes,
    parse_cpu,
    parse_duration,
    parse_gpu,
)
from workloads.resources import Resources
from workloads.spec import (
    JobSpec,
    RestartPolicy,
    SimulatedRun,
    TaskGroup,
    parse_job_spec,
)

__all__ = [
    "ENDED",
    "FINAL",
    "TRANSITIONS",
    "IllegalTransition",
    "JobSpec",
    "JobState",
    "Resources",
    "RestartPolicy",
    "SimulatedRun",
    "SpecError",
    "TaskGroup",
    "TaskState",
    "can_transition",
    "check_transition",
    "format_bytes",
    "format_cpu",
    "format_gpu",
    "job_state",
    "parse_bytes",
    "parse_cpu",
    "parse_duration",
    "parse_gpu",
    "parse_job_spec",
]
