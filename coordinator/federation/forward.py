"""A submission to a region the job's spec does not name goes to its first named region.

A job's home is where it was submitted, or the first region its spec names when it was
submitted somewhere the spec does not name (`model.home_region`). The region that
received such a submission makes no job itself: its API forwards the request, as the
user sent it (same client id, same spec), to the home's API (`mesh.<home>.api.job.submit`)
and answers with the home's reply plus `home`. So a retry with the same client id is
answered by the home's own de-duplication (never a second job), the home checks the spec
against its own pools, and nothing is kept where the user did not ask for it: if the home
does not answer, the user is told so (`UNAVAILABLE`) and no job exists in either region
(or, after a time-out, possibly in the home only, which a retry finds).

A forward never loops: it goes to a region the spec names, where `home_region` is that
region itself. `route` is the decision (pure); `submit` the one request (the shell).
"""

from __future__ import annotations

from collections.abc import Sequence

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from coordinator.federation.model import home_region
from mesh import subjects
from mesh.codec import WireError, unpack
from mesh.refusals import PermissionDenied
from mesh.schema import ApiError, ErrorCode

__all__ = ["FORWARD_TIMEOUT_S", "route", "submit", "with_home"]

# The home answers a submit after one log append (milliseconds); this bounds a WAN round
# trip and a leader change there. Under the 5 s a follower waits for its own leader
# (coordinator/api.py FORWARD_TIMEOUT_S) and the CLI's 10 s, so the user hears this
# region's clear answer rather than a bare time-out.
FORWARD_TIMEOUT_S = 4.0


def route(here: str, regions: Sequence[str], *, made_here: bool = False) -> str | None:
    """The region a submission made in `here` must be forwarded to, or None to make the
    job here. `made_here`: this client id already made a job here (one submitted before
    submissions were forwarded): its retry is answered here, as before, never a second job
    elsewhere."""
    if made_here:
        return None
    home = home_region(here, regions)
    return None if home == here else home


def with_home(reply: dict, home: str) -> dict:
    """The home's reply as this region gives it to the user: `home` says where the job
    is (a successful reply of `job.submit`; an error is passed on as it is)."""
    if reply.get("ok") is True:
        return {**reply, "home": home}
    return reply


async def submit(nc, home: str, data: bytes, timeout: float = FORWARD_TIMEOUT_S) -> dict:
    """Send a `job.submit` request (its encoded bytes, unchanged) to `home`'s API and
    return its decoded reply with `home`. Raises ApiError(UNAVAILABLE) saying what
    happened when the home cannot be asked or does not answer in `timeout`."""
    subject = subjects.api(home, "job.submit")
    try:
        msg = await nc.request(subject, data, timeout=timeout)
    except NoRespondersError:
        raise ApiError(
            ErrorCode.UNAVAILABLE,
            f"the job's home region {home} (the first of its spec's regions) has no "
            f"coordinator answering on {subject}: nothing was submitted; retry when {home} "
            "is back, or name this region in the spec's regions",
        ) from None
    except NatsTimeout:
        raise ApiError(
            ErrorCode.UNAVAILABLE,
            f"the job's home region {home} (the first of its spec's regions) did not answer "
            f"on {subject} in {timeout:g}s; no job was made in this region. Retry with the "
            "same client id: if it was made there, the retry finds it (never a second job)",
        ) from None
    except PermissionDenied as exc:
        raise ApiError(
            ErrorCode.UNAVAILABLE,
            f"this region's coordinator may not send to {subject} ({exc}); nothing was submitted",
        ) from None
    try:
        reply = unpack(msg.data)
    except (WireError, ValueError) as exc:
        raise ApiError(
            ErrorCode.UNAVAILABLE, f"region {home} answered {subject} with no reply: {exc}"
        ) from None
    if not isinstance(reply, dict):
        raise ApiError(ErrorCode.UNAVAILABLE, f"region {home} answered {subject} with no reply")
    return with_home(reply, home)
