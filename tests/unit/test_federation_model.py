"""A job's federation policy and the protocol's config are checked when built
(coordinator/federation/model.py); the home region rule."""

from __future__ import annotations

import math

import pytest

from coordinator.federation.model import FederationConfig, FedPolicy, home_region
from workloads.quantity import SpecError


def test_defaults_never_spill_and_never_declare_lost():
    p = FedPolicy()
    assert p.regions == () and p.spill_after is None and p.lost_after is None
    cfg = FederationConfig()
    assert cfg.nominate_timeout_s > 0 and cfg.reserve_ttl_s >= cfg.nominate_timeout_s


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"regions": ["eu"]}, "regions"),
        ({"regions": ("eu", "eu")}, "regions[1]"),
        ({"regions": ("eu", "a.b")}, "regions[1]"),
        ({"regions": ("",)}, "regions[0]"),
        ({"regions": tuple(f"r{i}" for i in range(33))}, "regions"),
        ({"spill_after": -1.0}, "spill.after"),
        ({"spill_after": math.nan}, "spill.after"),
        ({"spill_after": "30s"}, "spill.after"),
        ({"spill_after": True}, "spill.after"),
        ({"lost_after": 0.0}, "lost_after"),
        ({"lost_after": math.inf}, "lost_after"),
        ({"lost_after": 1e12}, "lost_after"),
    ],
)
def test_bad_policies_name_the_field(kwargs, field):
    with pytest.raises(SpecError) as err:
        FedPolicy(**kwargs)
    assert err.value.field == field


def test_spill_after_zero_spills_at_once_and_targets_skip_home():
    p = FedPolicy(regions=("us", "eu", "ap"), spill_after=0.0, lost_after=60.0)
    assert p.targets("eu") == ("us", "ap")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"nominate_timeout_s": 0.0}, "nominate_timeout_s"),
        ({"round_backoff_s": -1.0}, "round_backoff_s"),
        ({"reserve_ttl_s": 1.0, "nominate_timeout_s": 5.0}, "reserve_ttl_s"),
    ],
)
def test_bad_configs_name_the_field(kwargs, field):
    with pytest.raises(SpecError) as err:
        FederationConfig(**kwargs)
    assert err.value.field == field


def test_home_is_where_submitted_when_named_or_none_named_else_the_first_named():
    assert home_region("eu", ()) == "eu"
    assert home_region("eu", ("us", "eu")) == "eu"
    assert home_region("ap", ("us", "eu")) == "us"
    with pytest.raises(SpecError):
        home_region("a*b", ())
