"""Linux PSI in the agent's heartbeat: parsed from /proc/pressure (a fake tree in a temp
dir, and this machine's own where it has one), None where the kernel gives none, and
carried by NodeState through the codec (old senders, without the fields, still decode)."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from agent.probe import HostProbe, HostSample, PressureProbe, parse_pressure
from agent.service import Agent, AgentConfig
from mesh.codec import WireError, decode, encode, to_wire
from mesh.schema import NodeState

GiB = 1024**3
CPU = (
    "some avg10=26.22 avg60=38.13 avg300=16.82 total=1042013601\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
)
MEMORY = (
    "some avg10=3.50 avg60=1.00 avg300=0.20 total=3793\n"
    "full avg10=1.25 avg60=0.00 avg300=0.00 total=1387\n"
)


def fake_proc(root: Path, cpu: str | None = CPU, memory: str | None = MEMORY) -> Path:
    (root / "pressure").mkdir(parents=True)
    if cpu is not None:
        (root / "pressure" / "cpu").write_text(cpu)
    if memory is not None:
        (root / "pressure" / "memory").write_text(memory)
    return root


def test_some_avg10_is_read_from_each_file(tmp_path):
    probe = PressureProbe(fake_proc(tmp_path))
    assert probe.sample() == (26.22, 3.5)  # `some`, not `full`; avg10, not avg60
    (tmp_path / "pressure" / "cpu").write_text(CPU.replace("26.22", "90.5"))
    assert probe.sample() == (90.5, 3.5)  # read afresh each sample


def test_no_pressure_directory_reads_none(tmp_path):
    probe = PressureProbe(tmp_path)  # a kernel without PSI, or a container hiding it
    assert probe.sample() == (None, None)
    # known absent: not tried again (a file appearing later is not looked for)
    fake_proc(tmp_path)
    assert probe.sample() == (None, None)


def test_one_missing_file_costs_only_its_resource(tmp_path):
    probe = PressureProbe(fake_proc(tmp_path, memory=None))
    assert probe.sample() == (26.22, None)


def test_an_unreadable_file_reads_none(tmp_path):
    fake_proc(tmp_path)
    (tmp_path / "pressure" / "memory").unlink()
    (tmp_path / "pressure" / "memory").mkdir()  # reading a directory fails (EISDIR)
    assert PressureProbe(tmp_path).sample() == (26.22, None)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (CPU, 26.22),
        ("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 0.0),
        ("some avg60=1.00 avg10=7.5 total=3\n", 7.5),  # by name, not position
        ("some avg10=250 avg60=0 total=1\n", 100.0),  # clamped to 0..100
        ("full avg10=4.00 avg60=0 total=1\n", None),  # no `some` line
        ("some avg10=lots avg60=0\n", None),
        ("some avg10=nan\n", None),
        ("", None),
        ("garbage\x00\n", None),
    ],
)
def test_parse_pressure(text, value):
    assert parse_pressure(text) == value


def test_this_machines_pressure_if_the_kernel_has_it(tmp_path):
    cpu, memory = PressureProbe().sample()
    path = Path("/proc/pressure/cpu")
    try:
        text = path.read_text()
    except OSError:
        assert cpu is None
    else:
        assert cpu is not None and 0.0 <= cpu <= 100.0
        assert parse_pressure(text) is not None
    try:
        Path("/proc/pressure/memory").read_text()
    except OSError:
        assert memory is None
    else:
        assert memory is not None and 0.0 <= memory <= 100.0
    sample = HostProbe(tmp_path).sample()  # the host probe reads the same files
    assert (sample.cpu_pressure is None) == (cpu is None)
    assert (sample.mem_pressure is None) == (memory is None)


def test_host_probe_takes_a_proc_root(tmp_path):
    sample = HostProbe(tmp_path, proc_root=fake_proc(tmp_path / "proc")).sample()
    assert (sample.cpu_pressure, sample.mem_pressure) == (26.22, 3.5)
    bare = HostProbe(tmp_path, proc_root=tmp_path / "nothing").sample()
    assert (bare.cpu_pressure, bare.mem_pressure) == (None, None)


def test_the_agents_heartbeat_carries_pressure(tmp_path):
    agent = Agent(AgentConfig("nats://unused", data_dir=str(tmp_path / "a")))
    sample = HostSample(8, 50.0, 9.0, 16 * GiB, GiB, 100 * GiB, GiB, (), 26.22, 3.5)
    state = agent.node_state(sample)
    assert (state.cpu_pressure, state.mem_pressure) == (26.22, 3.5)
    assert decode(NodeState, encode(state)) == state
    none = agent.node_state(HostSample(8, 50.0, 9.0, 16 * GiB, GiB, 100 * GiB, GiB))
    assert (none.cpu_pressure, none.mem_pressure) == (None, None)
    assert decode(NodeState, encode(none)) == none


def test_an_older_senders_heartbeat_still_decodes():
    wire = to_wire(NodeState("n1", "r", 3, 1.0, cpu_percent=12.0))
    del wire["cpu_pressure"], wire["mem_pressure"]
    state = decode(NodeState, msgpack.packb(wire))
    assert state.cpu_pressure is None and state.mem_pressure is None
    assert state.cpu_percent == 12.0


@pytest.mark.parametrize("value", [-0.5, 100.5, "high", True])
def test_pressure_out_of_range_is_refused(value):
    wire = to_wire(NodeState("n1", "r", 3, 1.0))
    wire["cpu_pressure"] = value
    with pytest.raises(WireError) as info:
        decode(NodeState, msgpack.packb(wire))
    assert info.value.field == "cpu_pressure"
