"""Simulated load curves: the pure `load_at` of each curve, the seeded jitter, and the
`simulate.load` spec validated field by field (and kept exactly by to_dict)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workloads import SpecError, parse_job_spec
from workloads.load import LoadCurve, check_load, jitter, level_at, load_at, parse_load
from workloads.spec import SimulatedRun

P = "tasks[0].simulate.load"


def diurnal(**kw) -> LoadCurve:
    return parse_load({"curve": "diurnal", **kw}, "load")


# --------------------------------------------------------------------------- curves


def test_flat_is_peak_times_cores():
    load = parse_load({"curve": "flat", "peak": 0.6, "cores": 4}, "load")
    assert [load_at(load, t) for t in (0, 1.5, 1e9)] == pytest.approx([2.4, 2.4, 2.4])
    # without its own cores it scales to the task's request
    bare = parse_load({"peak": 0.5}, "load")
    assert bare.curve == "flat" and bare.cores is None
    assert load_at(bare, 10.0, request_cores=3.0) == pytest.approx(1.5)
    assert load_at(bare, 10.0) == pytest.approx(0.5)  # one core when nothing says


def test_diurnal_spans_trough_to_peak_over_its_period():
    load = diurnal(peak=0.8, trough=0.2, period="600s", cores=2)
    ts = [i * 600 / 240 for i in range(241)]
    values = [load_at(load, t) for t in ts]
    assert min(values) == pytest.approx(0.2 * 2, abs=1e-9)
    assert max(values) == pytest.approx(0.8 * 2, abs=1e-9)
    # the formula: mean and rising at t = 0, peak a quarter period on, trough at 3/4
    assert load_at(load, 0.0) == pytest.approx(1.0)
    assert load_at(load, 150.0) == pytest.approx(1.6)
    assert load_at(load, 450.0) == pytest.approx(0.4)
    assert load_at(load, 10.0) > load_at(load, 0.0)
    # periodic
    for t in (0.0, 37.0, 299.0):
        assert load_at(load, t + 600.0) == pytest.approx(load_at(load, t))
        assert load_at(load, t + 6000.0) == pytest.approx(load_at(load, t))


def test_diurnal_phase_shifts_and_origin_moves_time_zero():
    base = diurnal(peak=1.0, trough=0.0, period=100)
    shifted = diurnal(peak=1.0, trough=0.0, period=100, phase="25s")
    moved = diurnal(peak=1.0, trough=0.0, period=100, origin=1_000_000)
    for t in (0.0, 13.0, 40.0, 77.0):
        assert level_at(shifted, t) == pytest.approx(level_at(base, t + 25.0))
        assert level_at(moved, 1_000_000 + t) == pytest.approx(level_at(base, t))
    assert level_at(shifted, 0.0) == pytest.approx(1.0)  # a quarter period on: the peak
    assert level_at(base, 0.0) != pytest.approx(level_at(base, 30.0))


def test_diurnal_default_period_is_a_day():
    load = diurnal(peak=0.9, trough=0.3)
    assert load.period_s == 86400.0
    assert level_at(load, 86400 / 4) == pytest.approx(0.9)


def test_step_holds_the_trough_then_jumps():
    load = parse_load(
        {"curve": "step", "trough": 0.25, "step_at": "60s", "step_to": 0.75, "cores": 4},
        "load",
    )
    assert load_at(load, 0.0) == pytest.approx(1.0)
    assert load_at(load, 59.999) == pytest.approx(1.0)
    assert load_at(load, 60.0) == pytest.approx(3.0)
    assert load_at(load, 1e6) == pytest.approx(3.0)
    # a step down is a step too; step_to defaults to peak
    down = parse_load({"curve": "step", "peak": 0.9, "trough": 0.5, "step_at": 5}, "load")
    assert down.step_to == 0.9 and level_at(down, 6.0) == pytest.approx(0.9)
    lower = parse_load({"curve": "step", "trough": 0.5, "step_at": 5, "step_to": 0.1}, "load")
    assert level_at(lower, 6.0) == pytest.approx(0.1)
    # measured from origin
    later = parse_load({"curve": "step", "step_at": 10, "step_to": 1.0, "origin": 500}, "load")
    assert level_at(later, 505.0) == 0.0 and level_at(later, 510.0) == 1.0


_levels = st.floats(0.0, 1.0)


@given(
    peak=_levels,
    trough=_levels,
    period=st.floats(0.001, 1e6),
    phase=st.floats(0.0, 1e6),
    t=st.floats(-1e10, 1e10),
)
def test_diurnal_stays_within_trough_and_peak(peak, trough, period, phase, t):
    lo, hi = min(peak, trough), max(peak, trough)
    load = check_load(LoadCurve("diurnal", hi, lo, period, phase))
    x = level_at(load, t)
    assert lo - 1e-9 <= x <= hi + 1e-9


def test_jitter_is_deterministic_and_in_range():
    draws = [jitter(7, s) for s in range(4000)]
    assert draws == [jitter(7, s) for s in range(4000)]
    assert draws != [jitter(8, s) for s in range(4000)]
    assert all(-1.0 <= d < 1.0 for d in draws)
    assert abs(sum(draws) / len(draws)) < 0.05  # centred
    assert min(draws) < -0.9 and max(draws) > 0.9  # spread over the whole range
    assert len(set(draws)) == len(draws)


# --------------------------------------------------------------------------- the spec


def _err(load) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_job_spec(
            {"name": "j", "tasks": [{"role": "a", "simulate": {"duration": 1, "load": load}}]}
        )
    return info.value


@pytest.mark.parametrize(
    ("load", "field", "problem"),
    [
        ({"curve": "sawtooth"}, f"{P}.curve", "expected one of flat, diurnal, step"),
        ({"curve": 3}, f"{P}.curve", "expected one of"),
        ({"curve": "diurnal", "peak": 0.2, "trough": 0.5}, f"{P}.peak", "below trough"),
        ({"curve": "step", "peak": 0.1, "trough": 0.2, "step_at": 1}, f"{P}.peak", "below"),
        ({"noise": -0.1}, f"{P}.noise", "between 0 and 1"),
        ({"noise": 2}, f"{P}.noise", "between 0 and 1"),
        ({"peak": 1.5}, f"{P}.peak", "between 0 and 1"),
        ({"peak": "high"}, f"{P}.peak", "expected a number"),
        ({"peak": True}, f"{P}.peak", "expected a number"),
        ({"peak": math.nan}, f"{P}.peak", "between 0 and 1"),
        ({"cores": -1}, f"{P}.cores", "between 0 and 4096"),
        ({"cores": 1e9}, f"{P}.cores", "between 0 and 4096"),
        ({"curve": "diurnal", "period": 0}, f"{P}.period", "more than 0"),
        ({"curve": "diurnal", "period": "soon"}, f"{P}.period", "expected a duration"),
        ({"curve": "diurnal", "phase": "-5s"}, f"{P}.phase", "negative"),
        ({"curve": "diurnal", "step_at": 5}, f"{P}.step_at", "applies only to a step curve"),
        ({"trough": 0.1}, f"{P}.trough", "applies only to a diurnal and step curve, not flat"),
        ({"period": 60}, f"{P}.period", "applies only to a diurnal curve"),
        ({"curve": "step"}, f"{P}.step_at", "required for a step curve"),
        ({"curve": "step", "step_at": 1, "step_to": 3}, f"{P}.step_to", "between 0 and 1"),
        ({"origin": -1}, f"{P}.origin", "between 0"),
        ({"pk": 0.5}, f"{P}.pk", "unknown field"),
        ("diurnal", P, "expected a mapping"),
    ],
)
def test_bad_load_names_the_field(load, field, problem):
    err = _err(load)
    assert err.field == field, str(err)
    assert problem in err.problem, str(err)


def test_a_service_replica_runs_forever_with_a_load():
    spec = parse_job_spec(
        "name: web\ntasks:\n  - role: r\n    count: 3\n    resources: {cpu: 2}\n"
        "    simulate:\n      duration: forever\n      load: {curve: diurnal, peak: 0.8,"
        " trough: 0.25, period: 10m, noise: 0.05}\n"
    )
    sim = spec.tasks[0].simulate
    assert sim.duration_s is None and sim.exit_code == 0
    assert sim.load == LoadCurve(
        "diurnal", 0.8, 0.25, 600.0, 0.0, None, 0.05, 0.0, step_to=0.8, origin=0.0
    )
    assert parse_job_spec(spec.to_dict()) == spec
    assert spec.to_dict()["tasks"][0]["simulate"]["duration"] == "forever"


def test_forever_takes_no_exit_code_and_duration_is_still_required():
    with pytest.raises(SpecError, match=r"simulate.exit_code: a run of duration 'forever'"):
        parse_job_spec(
            {
                "name": "j",
                "tasks": [{"role": "a", "simulate": {"duration": "forever", "exit_code": 1}}],
            }
        )
    with pytest.raises(SpecError, match=r"simulate.duration: required .*'forever'"):
        parse_job_spec({"name": "j", "tasks": [{"role": "a", "simulate": {"load": {}}}]})


def test_a_load_keeps_its_run_finite_when_a_duration_is_given():
    spec = parse_job_spec(
        {
            "name": "j",
            "tasks": [{"role": "a", "simulate": {"duration": "2m", "load": {"peak": 0.3}}}],
        }
    )
    assert spec.tasks[0].simulate == SimulatedRun(120.0, 0, LoadCurve("flat", 0.3, step_to=0.3))
    assert parse_job_spec(spec.to_dict()) == spec
