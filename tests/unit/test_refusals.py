"""The pure parts of failing fast: reading a server's refusal, what to tell the operator,
how often to retry, and how often to say so."""

from __future__ import annotations

import logging
import ssl

from nats.errors import AuthorizationError
from nats.errors import Error as NatsError

from mesh.logs import KeyValueFormatter, Throttle, default_level, fields
from mesh.refusals import (
    REFUSED_BACKOFF_MAX,
    AuthorizationRefused,
    Denial,
    PermissionDenied,
    TlsRefused,
    is_authorization_failure,
    is_tls_failure,
    parse_denial,
    reconnect_delay,
)


def test_a_denial_is_read_as_nats_py_reports_it():
    # nats-py lowercases the server's -ERR line before the error callback sees it
    reported = 'nats: permissions violation for publish to "mesh.eu.api.job.list"'
    assert parse_denial(reported) == Denial("publish", "mesh.eu.api.job.list")
    raw = 'Permissions Violation for Subscription to "mesh.eu.state.*"'
    assert parse_denial(raw) == Denial("subscribe", "mesh.eu.state.*")
    reply = 'nats: permissions violation for publish with reply of "_inbox.x.y"'
    assert parse_denial(reply) == Denial("publish", "_inbox.x.y")
    assert parse_denial("nats: unexpected EOF") is None
    assert parse_denial("nats: 'authorization violation'") is None


def test_a_permission_message_names_subject_identity_and_fix():
    err = PermissionDenied(
        Denial("publish", "mesh.eu.api.job.list"), "user:admin", "mesh.eu.api.job.list"
    )
    assert isinstance(err, NatsError)  # handlers of nats-py errors still handle it
    assert '"mesh.eu.api.job.list" (region eu)' in err.message
    assert "user:admin" in err.message and "CN=user:admin" in err.message
    assert "--region" in err.message and "mesh certs nats-conf DIR --region R" in err.message
    # the subject as the caller spelled it, not as nats-py lowercased it
    denied = PermissionDenied(Denial("publish", "mesh.eu.x"), "agent:n1", "mesh.EU.x")
    assert '"mesh.EU.x"' in denied.message


def test_authorization_and_tls_refusals_say_what_to_do():
    auth = AuthorizationRefused("tls://h:4222", "agent:ghost")
    assert "tls://h:4222" in auth.message and "CN=agent:ghost" in auth.message
    assert "mesh certs nats-conf" in auth.message
    bare = TlsRefused("tls://h:4222", "", "CERTIFICATE_VERIFY_FAILED", has_cert=False)
    for hint in ("--certs DIR", "MESH_CERTS", "mesh context add", "mesh context use"):
        assert hint in bare.message
    wrong_ca = TlsRefused("tls://h:4222", "user:a", "unknown ca", has_cert=True)
    assert "--certs" in wrong_ca.message and "ca.crt" in wrong_ca.message


def test_refusals_are_told_from_a_server_that_is_away():
    assert is_authorization_failure(AuthorizationError())
    assert is_authorization_failure(NatsError("nats: 'Authorization Violation'"))
    assert not is_authorization_failure(ConnectionRefusedError(111, "refused"))
    assert is_tls_failure(ssl.SSLCertVerificationError("certificate verify failed"))
    assert is_tls_failure(ssl.SSLError("tlsv13 alert certificate required"))
    assert not is_tls_failure(ConnectionRefusedError(111, "refused"))
    assert not is_tls_failure(BrokenPipeError())


def test_reconnects_back_off_only_while_refused():
    assert reconnect_delay(0, 0) == 0.0  # the first try after a drop is at once
    assert reconnect_delay(1, 0) == reconnect_delay(50, 0) == 0.25  # away: keep trying
    delays = [reconnect_delay(n, n) for n in range(1, 12)]
    assert delays == sorted(delays) and delays[0] == 0.5
    assert delays[-1] == REFUSED_BACKOFF_MAX
    waited, attempts = 0.0, 0
    while waited < 600:
        attempts += 1
        waited += reconnect_delay(attempts, attempts)
    assert attempts < 70  # ten refused minutes: some 60 attempts, not 2,400


def test_throttle_logs_the_first_then_one_per_period_with_the_count():
    t = Throttle(every_s=30.0)
    assert t.allow("k", 0.0) == 0
    assert [t.allow("k", s) for s in (1.0, 2.0, 29.0)] == [None, None, None]
    assert t.allow("other", 2.0) == 0  # keys are independent
    assert t.allow("k", 31.0) == 3
    t.reset("k")
    assert t.allow("k", 32.0) == 0


def test_log_lines_carry_their_fields():
    record = logging.LogRecord("mesh.agent", logging.INFO, "", 0, "agent %s started", ("n1",), None)
    record.fields = fields(event="started", url="tls://h:4222", note="two words")["fields"]
    line = KeyValueFormatter().format(record)
    assert line.count("\n") == 0
    assert 'msg="agent n1 started" event=started url=tls://h:4222 note="two words"' in line


def test_long_running_commands_log_info_by_default():
    assert {default_level(c) for c in ("agent", "coordinator", "up")} == {"info"}
    assert {default_level(c) for c in ("job", "node", "cluster", "pool")} == {"warning"}
