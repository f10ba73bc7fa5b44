"""Epochs and exactly one run (coordinator/federation/epochs.py and holder.py), rule by rule."""

from __future__ import annotations

import pytest

from coordinator.federation import holder as h
from coordinator.federation.epochs import (
    HomeRecord,
    Phase,
    Run,
    cancel,
    declare_lost,
    expire_nomination,
    finish_local,
    handle,
    new_job,
    nominate,
    on_admitted,
    on_finished,
    on_gave_up,
    on_refused,
    on_unreachable,
    resend,
    resolve,
)
from coordinator.federation.holder import Hold, HolderRecord, Stop
from coordinator.federation.messages import (
    Admitted,
    Confirm,
    Finished,
    GaveUp,
    Nominate,
    Refused,
    Revoke,
    dedup_id,
)
from coordinator.federation.model import FederationConfig, FedPolicy, RegionView

CFG = FederationConfig()


def job(lost_after: float | None = None) -> HomeRecord:
    policy = FedPolicy(regions=("eu", "us", "ap"), spill_after=0.0, lost_after=lost_after)
    return new_job("j1", "eu", policy, 0.0)


def held(lost_after: float | None = None, holder: str = "us", at: float = 10.0) -> HomeRecord:
    rec = nominate(job(lost_after), holder, 1.0).record
    return on_admitted(rec, Admitted("j1", rec.epoch, "eu", holder), at).record


def down(region: str, last_heard: float | None) -> RegionView:
    return RegionView(region, fresh=False, reachable=False, fits=False, last_heard=last_heard)


# --- the home's record --------------------------------------------------------------


def test_nominate_issues_a_new_epoch_and_the_job_leaves_local():
    rec = job()
    assert (rec.phase, rec.epoch) == (Phase.LOCAL, 0)
    step = nominate(rec, "us", 5.0)
    assert step.record.phase is Phase.NOMINATED and step.record.epoch == 1
    assert step.record.region == "us" and step.record.since == 5.0
    assert step.send == (Nominate("j1", 1, "eu", "us"),)


def test_nominate_only_a_local_job_to_a_named_other_region():
    with pytest.raises(ValueError, match="only a LOCAL job"):
        nominate(nominate(job(), "us", 1.0).record, "ap", 2.0)
    with pytest.raises(ValueError, match="not one of its spill targets"):
        nominate(job(), "eu", 1.0)
    with pytest.raises(ValueError, match="not one of its spill targets"):
        nominate(job(), "sa", 1.0)


def test_admitted_current_epoch_is_held_and_confirmed_and_a_repeat_is_the_same():
    rec = nominate(job(), "us", 1.0).record
    step = on_admitted(rec, Admitted("j1", 1, "eu", "us"), 2.0)
    assert step.record.phase is Phase.HELD and step.record.region == "us"
    assert step.send == (Confirm("j1", 1, "eu", "us"),)
    again = on_admitted(step.record, Admitted("j1", 1, "eu", "us"), 3.0)
    assert again.record == step.record and again.send == step.send


def test_a_late_admission_after_a_time_out_is_revoked():
    rec = nominate(job(), "us", 1.0).record
    rec = expire_nomination(rec, CFG, 1.0 + CFG.nominate_timeout_s).record
    assert rec.phase is Phase.LOCAL and rec.epoch == 2
    step = on_admitted(rec, Admitted("j1", 1, "eu", "us"), 20.0)
    assert step.record == rec
    assert step.send == (Revoke("j1", 1, "eu", "us", "superseded by epoch 2 (local in eu)"),)
    assert "duplicate" in step.why


def test_a_late_admission_after_a_refusal_elsewhere_is_revoked():
    rec = nominate(job(), "us", 1.0).record
    rec = expire_nomination(rec, CFG, 10.0).record
    rec = nominate(rec, "ap", 10.0).record
    rec = on_admitted(rec, Admitted("j1", 3, "eu", "ap"), 11.0).record
    step = on_admitted(rec, Admitted("j1", 1, "eu", "us"), 12.0)
    assert step.record == rec
    (revoke,) = step.send
    assert revoke.holder == "us" and revoke.epoch == 1
    assert revoke.reason == "superseded by epoch 3 (held ap)"


def test_admission_of_the_current_epoch_by_another_region_or_an_unissued_one_is_revoked():
    rec = nominate(job(), "us", 1.0).record
    (rv,) = on_admitted(rec, Admitted("j1", 1, "eu", "ap"), 2.0).send
    assert rv.holder == "ap" and "belongs to us" in rv.reason
    (rv,) = on_admitted(rec, Admitted("j1", 7, "eu", "us"), 2.0).send
    assert "never issued" in rv.reason


def test_a_stale_run_reported_by_a_region_that_returns_is_revoked():
    rec = held(lost_after=60.0)
    lost = declare_lost(rec, down("us", 10.0), 70.0).record
    rec2 = on_admitted(nominate(lost, "ap", 71.0).record, Admitted("j1", 3, "eu", "ap"), 72.0)
    step = on_admitted(rec2.record, Admitted("j1", 1, "eu", "us", running=True), 500.0)
    (rv,) = step.send
    assert rv == Revoke("j1", 1, "eu", "us", "superseded by epoch 3 (held ap)")
    assert "a run of epoch 1" in step.why


def test_a_report_after_done_is_revoked():
    rec = held()
    done = on_finished(rec, Finished("j1", 1, "eu", "us", "succeeded"), 20.0).record
    assert done.phase is Phase.DONE and done.outcome == "succeeded"
    (rv,) = on_admitted(done, Admitted("j1", 1, "eu", "us", running=True), 21.0).send
    assert "already succeeded" in rv.reason


def test_refusal_of_the_current_nomination_returns_home_at_a_new_epoch():
    rec = nominate(job(), "us", 1.0).record
    step = on_refused(rec, Refused("j1", 1, "eu", "us", "no room"), 2.0)
    assert step.record.phase is Phase.LOCAL and step.record.epoch == 2
    assert step.record.tried == ("us",) and step.record.last_try == 2.0
    assert step.record.queued_since == 0.0  # a refusal does not restart the wait at home
    # a refusal of anything else is stale
    assert on_refused(step.record, Refused("j1", 1, "eu", "us", "x"), 3.0).record == step.record


def test_a_holder_giving_up_returns_the_job_home_requeued():
    rec = held(at=10.0)
    step = on_gave_up(rec, GaveUp("j1", 1, "eu", "us", "node lost"), 50.0)
    assert step.record.phase is Phase.LOCAL and step.record.epoch == 2
    assert step.record.queued_since == 50.0 and step.record.tried == ("us",)
    # stale: ignored
    assert on_gave_up(step.record, GaveUp("j1", 1, "eu", "us", "x"), 51.0).record == step.record


def test_a_target_that_gives_up_its_reservation_counts_as_tried():
    rec = nominate(job(), "us", 1.0).record
    step = on_gave_up(rec, GaveUp("j1", 1, "eu", "us", "no confirm"), 2.0)
    assert step.record.phase is Phase.LOCAL and step.record.tried == ("us",)


def test_the_outcome_of_a_superseded_run_is_ignored():
    rec = held(lost_after=5.0)
    lost = declare_lost(rec, down("us", 10.0), 15.0).record
    step = on_finished(lost, Finished("j1", 1, "eu", "us", "succeeded"), 16.0)
    assert step.record == lost and "superseded by epoch 2" in step.why


def test_an_unreachable_holder_keeps_its_job_until_lost_after():
    rec = held(lost_after=60.0, at=10.0)
    step = on_unreachable(rec, "us", 20.0)
    assert step.record == rec and step.send == () and "lost after 60s" in step.why
    assert declare_lost(rec, down("us", 15.0), 74.9).record == rec
    step = declare_lost(rec, down("us", 15.0), 75.0)
    assert step.record.phase is Phase.LOCAL and step.record.epoch == 2
    assert step.send == (Revoke("j1", 1, "eu", "us", step.send[0].reason),)
    assert "declared lost" in step.send[0].reason


def test_lost_after_counts_from_the_confirm_when_that_is_later():
    rec = held(lost_after=60.0, at=100.0)
    assert declare_lost(rec, down("us", 10.0), 159.0).record == rec
    assert declare_lost(rec, down("us", 10.0), 160.0).record.phase is Phase.LOCAL


def test_never_lost_by_default_nor_on_unknown_silence_nor_while_reachable():
    assert declare_lost(held(), down("us", 0.0), 1e9).record.phase is Phase.HELD
    rec = held(lost_after=1.0)
    assert declare_lost(rec, down("us", None), 1e9).record.phase is Phase.HELD
    up = RegionView("us", fresh=True, reachable=True, fits=True, last_heard=0.0)
    assert declare_lost(rec, up, 1e9).record.phase is Phase.HELD
    assert declare_lost(rec, down("ap", 0.0), 1e9).record.phase is Phase.HELD


def test_local_finish_cancel_and_resend():
    assert finish_local(job(), "succeeded", 3.0).record.phase is Phase.DONE
    with pytest.raises(ValueError):
        finish_local(held(), "succeeded", 3.0)
    step = cancel(held(), "killed by alice", 4.0)
    assert step.record.phase is Phase.DONE and step.record.outcome == "killed"
    assert step.send == (Revoke("j1", 1, "eu", "us", "killed by alice"),)
    assert cancel(job(), "x", 4.0).send == ()
    assert resend(nominate(job(), "us", 1.0).record) == (Nominate("j1", 1, "eu", "us"),)
    assert resend(held()) == () and resend(job()) == ()


def test_handle_dispatches_and_refuses_another_jobs_message():
    rec = nominate(job(), "us", 1.0).record
    assert handle(rec, Admitted("j1", 1, "eu", "us"), 2.0).record.phase is Phase.HELD
    with pytest.raises(ValueError):
        handle(rec, Admitted("j2", 1, "eu", "us"), 2.0)


def test_highest_epoch_wins_deterministically():
    res = resolve([Run("us", 1), Run("ap", 3), Run("sa", 2)])
    assert res.keep == Run("ap", 3)
    assert [r for r, _ in res.stop] == [Run("sa", 2), Run("us", 1)]
    assert all("superseded by epoch 3 in ap" == why for _, why in res.stop)
    tie = resolve([Run("us", 2), Run("ap", 2)])
    assert tie.keep == Run("ap", 2) and tie.stop[0][0] == Run("us", 2)
    assert resolve([Run("ap", 2), Run("us", 2)]) == tie
    assert resolve([]).keep is None


def test_dedup_ids_name_the_placement():
    assert dedup_id(Nominate("j1", 3, "eu", "us")) == "nominate:j1:3"
    assert dedup_id(Admitted("j1", 3, "eu", "us")) != dedup_id(
        Admitted("j1", 3, "eu", "us", running=True)
    )


# --- the holder's side ---------------------------------------------------------------


def nom(epoch: int) -> Nominate:
    return Nominate("j1", epoch, "eu", "us")


def test_holder_reserves_on_a_fitting_nomination_and_refuses_otherwise():
    step = h.on_nominate(None, nom(1), True, 1.0)
    assert step.record.phase is Hold.RESERVED and step.start is None
    assert step.send == (Admitted("j1", 1, "eu", "us"),)
    step = h.on_nominate(None, nom(1), False, 1.0)
    assert step.record.phase is Hold.REFUSED
    assert step.send == (Refused("j1", 1, "eu", "us", "no room"),)


def test_a_retried_forward_is_the_same_job():
    first = h.on_nominate(None, nom(4), True, 1.0)
    again = h.on_nominate(first.record, nom(4), True, 2.0)
    assert again.record == first.record and again.send == first.send and again.start is None
    running = h.on_confirm(first.record, Confirm("j1", 4, "eu", "us"), 3.0).record
    again = h.on_nominate(running, nom(4), True, 4.0)
    assert again.record == running and again.start is None and again.stop is None
    assert again.send == (Admitted("j1", 4, "eu", "us", running=True),)
    # refused once, refused again, even if it would fit now
    refused = h.on_nominate(None, nom(5), False, 1.0).record
    assert h.on_nominate(refused, nom(5), True, 2.0).send[0] == Refused(
        "j1", 5, "eu", "us", "no room"
    )


def test_holder_refuses_an_epoch_not_above_one_seen():
    rec = h.on_nominate(None, nom(3), True, 1.0).record
    step = h.on_nominate(rec, nom(2), True, 2.0)
    assert step.record == rec and isinstance(step.send[0], Refused)
    assert "not above epoch 3" in step.send[0].reason


def test_confirm_starts_once():
    rec = h.on_nominate(None, nom(1), True, 1.0).record
    step = h.on_confirm(rec, Confirm("j1", 1, "eu", "us"), 2.0)
    assert step.start == 1 and step.record.phase is Hold.RUNNING
    again = h.on_confirm(step.record, Confirm("j1", 1, "eu", "us"), 3.0)
    assert again.start is None and again.record == step.record


def test_confirm_of_what_is_not_reserved_is_answered_with_gave_up():
    refused = h.on_nominate(None, nom(1), False, 1.0).record
    step = h.on_confirm(refused, Confirm("j1", 1, "eu", "us"), 2.0)
    assert step.start is None and isinstance(step.send[0], GaveUp)
    step = h.on_confirm(None, Confirm("j1", 2, "eu", "us"), 2.0)
    assert step.start is None and isinstance(step.send[0], GaveUp)


def test_a_revoke_before_its_nomination_keeps_the_late_nomination_from_being_admitted():
    rec = h.on_revoke(None, Revoke("j1", 1, "eu", "us", "timed out"), 1.0).record
    step = h.on_nominate(rec, nom(1), True, 2.0)
    assert step.record.phase is Hold.RELEASED and isinstance(step.send[0], GaveUp)
    assert h.on_confirm(step.record, Confirm("j1", 1, "eu", "us"), 3.0).start is None


def test_revoke_stops_a_run_and_drops_a_reservation():
    reserved = h.on_nominate(None, nom(1), True, 1.0).record
    step = h.on_revoke(reserved, Revoke("j1", 1, "eu", "us", "timed out"), 2.0)
    assert step.record.phase is Hold.RELEASED and step.stop is None
    running = h.on_confirm(reserved, Confirm("j1", 1, "eu", "us"), 2.0).record
    step = h.on_revoke(running, Revoke("j1", 1, "eu", "us", "lost"), 3.0)
    assert step.stop == Stop("j1", 1, "revoked: lost")
    assert h.on_revoke(step.record, Revoke("j1", 0, "eu", "us", "old"), 4.0).record == step.record


def test_a_higher_epoch_supersedes_the_run_held_here():
    reserved = h.on_nominate(None, nom(1), True, 1.0).record
    running = h.on_confirm(reserved, Confirm("j1", 1, "eu", "us"), 2.0).record
    step = h.on_nominate(running, nom(3), True, 3.0)
    assert step.stop == Stop("j1", 1, "superseded by epoch 3 from eu")
    assert step.record.epoch == 3 and step.record.phase is Hold.RESERVED
    step = h.on_revoke(running, Revoke("j1", 5, "eu", "us", "lost"), 3.0)
    assert step.stop is not None and step.stop.epoch == 1 and step.record.epoch == 5


def test_give_up_stops_first_then_tells_home():
    reserved = h.on_nominate(None, nom(1), True, 1.0).record
    running = h.on_confirm(reserved, Confirm("j1", 1, "eu", "us"), 2.0).record
    step = h.give_up(running, "drained", 3.0)
    assert step.stop == Stop("j1", 1, "given up: drained")
    assert step.send == (GaveUp("j1", 1, "eu", "us", "drained"),)
    assert h.give_up(step.record, "again", 4.0).send == ()


def test_a_reservation_without_confirm_expires():
    rec = h.on_nominate(None, nom(1), True, 1.0).record
    assert h.expire_reservation(rec, CFG, 1.0 + CFG.reserve_ttl_s - 0.1).record == rec
    step = h.expire_reservation(rec, CFG, 1.0 + CFG.reserve_ttl_s)
    assert step.record.phase is Hold.RELEASED and isinstance(step.send[0], GaveUp)


def test_finish_reports_the_outcome_once_running():
    reserved = h.on_nominate(None, nom(1), True, 1.0).record
    running = h.on_confirm(reserved, Confirm("j1", 1, "eu", "us"), 2.0).record
    step = h.finish(running, "succeeded", 9.0)
    assert step.send == (Finished("j1", 1, "eu", "us", "succeeded"),)
    assert h.report(step.record) == step.send[0]
    assert h.finish(reserved, "succeeded", 9.0).send == ()


def test_receive_refuses_another_jobs_message():
    rec = HolderRecord("j1", "eu", "us", 1, Hold.RESERVED, 0.0)
    with pytest.raises(ValueError):
        h.receive(rec, Nominate("j2", 2, "eu", "us"), True, 1.0)


# --- the two sides together -------------------------------------------------------------


def test_timed_out_target_that_admits_late_never_runs():
    """The nomination to us times out while its Nominate is still in flight; ap is held;
    us then receives the Nominate, admits it, and the home revokes it: us starts nothing."""
    home = nominate(job(), "us", 0.0)
    late_nominate = home.send[0]
    home = expire_nomination(home.record, CFG, CFG.nominate_timeout_s)
    revoke = home.send[0]
    home = nominate(home.record, "ap", 6.0)
    ap = h.on_nominate(None, home.send[0], True, 6.5)
    home = on_admitted(home.record, ap.send[0], 7.0)
    ap = h.on_confirm(ap.record, home.send[0], 7.5)
    assert ap.start == 3
    us = h.on_nominate(None, late_nominate, True, 8.0)  # the revoke is slower still
    answer = on_admitted(home.record, us.send[0], 8.5)
    (rv,) = answer.send
    us2 = h.on_revoke(us.record, rv, 9.0)
    assert us2.record.phase is Hold.RELEASED and us2.start is None and us2.stop is None
    # the first revoke arriving last changes nothing
    assert h.on_revoke(us2.record, revoke, 9.5).record == us2.record
