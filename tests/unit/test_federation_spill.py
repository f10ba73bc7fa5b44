"""The spill decision (coordinator/federation/spill.py): when, where, one at a time, rounds."""

from __future__ import annotations

from coordinator.federation.epochs import (
    Phase,
    expire_nomination,
    new_job,
    nominate,
    on_admitted,
    on_refused,
)
from coordinator.federation.messages import Admitted, Refused, Revoke
from coordinator.federation.model import FederationConfig, FedPolicy, RegionView
from coordinator.federation.spill import decide_spill, spill, tick

CFG = FederationConfig(nominate_timeout_s=5.0, round_backoff_s=30.0, reserve_ttl_s=60.0)


def view(region, fresh=True, reachable=True, fits=True, last_heard=0.0):
    return RegionView(region, fresh=fresh, reachable=reachable, fits=fits, last_heard=last_heard)


def all_up(*regions):
    return [view(r) for r in regions]


def job(regions=("eu", "us", "ap"), home="eu", after=30.0, lost_after=None, now=0.0):
    policy = FedPolicy(regions=tuple(regions), spill_after=after, lost_after=lost_after)
    return new_job("j1", home, policy, now)


def test_never_is_the_default_and_never_spills():
    rec = new_job("j1", "eu", FedPolicy(regions=("eu", "us")), 0.0)
    for now in (0.0, 1e6):
        d = decide_spill(rec, all_up("eu", "us"), CFG, now)
        assert d.target == "" and d.why == "spill: never"


def test_waits_after_in_its_home_first():
    rec = job(after=30.0, now=100.0)
    assert decide_spill(rec, all_up("us", "ap"), CFG, 129.9).target == ""
    assert "waiting at home" in decide_spill(rec, all_up("us", "ap"), CFG, 129.9).why
    assert decide_spill(rec, all_up("us", "ap"), CFG, 130.0).target == "us"


def test_a_job_placed_at_home_does_not_spill():
    rec = job()
    assert decide_spill(rec, all_up("us", "ap"), CFG, 100.0, queued=False).target == ""


def test_order_follows_the_preference_list_and_skips_home():
    rec = job(regions=("ap", "eu", "us"), home="eu")
    assert decide_spill(rec, all_up("us", "ap", "eu"), CFG, 100.0).target == "ap"
    rec = job(regions=("us", "ap", "eu"), home="eu")
    assert decide_spill(rec, all_up("ap", "us", "eu"), CFG, 100.0).target == "us"


def test_home_alone_has_nowhere_to_go():
    rec = job(regions=("eu",))
    assert decide_spill(rec, all_up("eu"), CFG, 100.0).why == "no other region named"


def test_stale_unreachable_not_fitting_and_unknown_regions_are_skipped():
    rec = job(regions=("eu", "us", "ap", "sa", "af"), home="eu")
    views = [
        view("us", fresh=False),
        view("ap", reachable=False),
        view("sa", fits=False),
        view("af"),
    ]
    d = decide_spill(rec, views, CFG, 100.0)
    assert d.target == "af"
    assert "us: summary stale" in d.why and "ap: unreachable" in d.why
    assert "sa: does not fit" in d.why
    # without af nothing is eligible; a region with no view at all is skipped too
    d = decide_spill(rec, views[:3], CFG, 100.0)
    assert d.target == "" and "af: no summary" in d.why


def test_one_nomination_at_a_time():
    rec = job()
    step = spill(rec, all_up("us", "ap"), CFG, 100.0)
    assert step.record.phase is Phase.NOMINATED and step.record.region == "us"
    d = decide_spill(step.record, all_up("us", "ap"), CFG, 100.0)
    assert d.target == "" and "one nomination at a time" in d.why
    # held elsewhere: still nothing
    held = on_admitted(step.record, Admitted("j1", 1, "eu", "us"), 101.0).record
    assert decide_spill(held, all_up("us", "ap"), CFG, 200.0).target == ""


def test_refusal_moves_to_the_next_region():
    rec = spill(job(), all_up("us", "ap"), CFG, 100.0).record
    rec = on_refused(rec, Refused("j1", 1, "eu", "us", "no room"), 101.0).record
    assert rec.phase is Phase.LOCAL and rec.tried == ("us",)
    d = decide_spill(rec, all_up("us", "ap"), CFG, 101.0)
    assert d.target == "ap" and "us: tried this round" in d.why


def test_time_out_moves_on_and_revokes():
    rec = spill(job(), all_up("us", "ap"), CFG, 100.0).record
    assert tick(rec, all_up("us", "ap"), CFG, 104.9).record is rec  # not yet
    step = tick(rec, all_up("us", "ap"), CFG, 105.0)
    assert step.record.phase is Phase.LOCAL and step.record.tried == ("us",)
    assert step.send == (Revoke("j1", 1, "eu", "us", "nomination timed out after 5s"),)
    nxt = tick(step.record, all_up("us", "ap"), CFG, 105.0)
    assert nxt.record.region == "ap" and nxt.record.epoch == step.record.epoch + 1


def test_unreachable_nominee_moves_on_without_waiting_for_the_time_out():
    rec = spill(job(), all_up("us", "ap"), CFG, 100.0).record
    step = tick(rec, [view("us", reachable=False), view("ap")], CFG, 101.0)
    assert step.record.phase is Phase.LOCAL and step.record.tried == ("us",)
    assert step.send and step.send[0].holder == "us"


def test_round_backs_off_then_starts_again():
    rec = job(regions=("eu", "us", "ap"))
    views = all_up("us", "ap")
    rec = spill(rec, views, CFG, 100.0).record
    rec = on_refused(rec, Refused("j1", rec.epoch, "eu", "us", "no room"), 101.0).record
    rec = spill(rec, views, CFG, 101.0).record
    assert rec.region == "ap"
    rec = expire_nomination(rec, CFG, 106.0).record
    assert rec.tried == ("us", "ap") and rec.last_try == 106.0
    d = decide_spill(rec, views, CFG, 135.9)
    assert d.target == "" and "round over" in d.why
    d = decide_spill(rec, views, CFG, 136.0)
    assert d.target == "us" and d.new_round
    step = nominate(rec, d.target, 136.0, new_round=d.new_round)
    assert step.record.tried == ()


def test_a_round_ends_when_the_untried_regions_do_not_fit():
    # us refused; ap does not fit now: the round is over, us is asked again after the back-off
    rec = spill(job(), all_up("us", "ap"), CFG, 100.0).record
    rec = on_refused(rec, Refused("j1", 1, "eu", "us", "no room"), 101.0).record
    views = [view("us"), view("ap", fits=False)]
    assert decide_spill(rec, views, CFG, 102.0).target == ""
    assert decide_spill(rec, views, CFG, 131.0).target == "us"


def test_nothing_eligible_before_any_try_waits_without_back_off():
    rec = job()
    views = [view("us", fits=False), view("ap", fresh=False)]
    assert decide_spill(rec, views, CFG, 100.0).target == ""
    views = [view("us"), view("ap", fresh=False)]
    assert decide_spill(rec, views, CFG, 100.5).target == "us"


def test_views_may_be_a_mapping():
    rec = job()
    views = {v.region: v for v in all_up("us", "ap")}
    assert decide_spill(rec, views, CFG, 100.0).target == "us"
