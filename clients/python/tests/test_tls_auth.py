"""TLS (a CA and a client certificate from `fenced certs`) and bearer tokens
(`fenced auth new-token`, a tokens file and a policy file) against three
real nodes."""

import time

import pytest

from fenced_client import (
    Client,
    Granted,
    PermissionDenied,
    Released,
    TlsError,
    Unauthenticated,
    Unavailable,
)

from conftest import Cluster

POLICY = """
[roles.py]
lock = ["py/"]
read = ["py/"]

[identities]
"py-cert" = ["py"]
"""


@pytest.fixture(scope="module")
def secure():
    c = Cluster(3, tls=True)
    token, sha256 = c.new_token()
    tokens = c.dir / "tokens.toml"
    tokens.write_text(f'[[token]]\nname = "py-client"\nsha256 = "{sha256}"\nroles = ["py"]\n')
    policy = c.dir / "policy.toml"
    policy.write_text(POLICY)
    c.env["FENCED_AUTH_TOKENS"] = str(tokens)
    c.env["FENCED_AUTH_POLICY"] = str(policy)
    c.certs("client", "--name", "py-cert")
    c.certs("client", "--name", "stranger")
    c.token = token
    try:
        c.start()
        yield c
    finally:
        c.stop()


def test_tls_and_token(secure, resource):
    with secure.client(ca=secure.pki / "ca.pem", token=secure.token) as c:
        g = c.acquire(resource, ttl=10)
        assert isinstance(g, Granted)
        assert c.describe(resource).last_token == g.token
        with c.lock(resource + "/kept", ttl=1.5) as lease:
            time.sleep(2.0)
            lease.check()
        assert isinstance(c.release(resource, g.owner_id, g.token), Released)


def test_token_from_the_environment(secure, resource, monkeypatch, tmp_path):
    path = tmp_path / "token"
    path.write_text(secure.token + "\nignored second line\n")
    monkeypatch.delenv("FENCED_TOKEN", raising=False)
    monkeypatch.setenv("FENCED_TOKEN_FILE", str(path))
    with Client(secure.endpoints, ca=secure.pki / "ca.pem") as c:
        assert isinstance(c.acquire(resource, ttl=10), Granted)
    monkeypatch.setenv("FENCED_TOKEN", secure.token)
    monkeypatch.delenv("FENCED_TOKEN_FILE")
    with Client(secure.endpoints, ca=secure.pki / "ca.pem") as c:
        assert c.describe(resource).held


def test_client_certificate_is_an_identity(secure, resource):
    pki = secure.pki
    with secure.client(
        ca=pki / "ca.pem", cert=pki / "client-py-cert.pem", key=pki / "client-py-cert-key.pem"
    ) as c:
        assert isinstance(c.acquire(resource, ttl=10), Granted)
    with secure.client(
        ca=pki / "ca.pem", cert=pki / "client-stranger.pem", key=pki / "client-stranger-key.pem"
    ) as c:
        with pytest.raises(PermissionDenied):
            c.describe(resource)


def test_refusals(secure, resource):
    ca = secure.pki / "ca.pem"
    with secure.client(ca=ca) as c:
        with pytest.raises(Unauthenticated) as e:
            c.acquire(resource, ttl=10)
        assert "no credentials" in str(e.value)
    with secure.client(ca=ca, token="fenced_not-a-real-token") as c:
        with pytest.raises(Unauthenticated) as e:
            c.describe(resource)
        assert "unknown or revoked token" in str(e.value)
    with secure.client(ca=ca, token=secure.token) as c:
        with pytest.raises(PermissionDenied) as e:
            c.acquire("billing/2026-07", ttl=10)
        assert "billing/2026-07" in str(e.value) and "py/" in str(e.value), str(e.value)


def test_wrong_ca_is_a_tls_error_not_retried(secure, resource, tmp_path):
    other = Cluster(1, tls=True)  # only for its CA
    try:
        with secure.client(ca=other.pki / "ca.pem", token=secure.token, call_timeout=5) as c:
            started = time.monotonic()
            with pytest.raises(TlsError) as e:
                c.describe(resource)
            assert time.monotonic() - started < 2.0
            assert "CERTIFICATE_VERIFY_FAILED" in str(e.value).upper() or "certificate" in str(e.value)
    finally:
        other.stop()


def test_plaintext_to_a_tls_cluster_fails(secure, resource):
    with secure.client(token=secure.token, call_timeout=1.0) as c:
        with pytest.raises(Unavailable):
            c.describe(resource)


def test_observing_needs_the_read_role_on_the_prefix(secure, resource):
    import threading

    from fenced_client import EventKind, TokenState

    ca = secure.pki / "ca.pem"
    with secure.client(ca=ca, token=secure.token) as c:
        g = c.acquire(resource, ttl=10)
        assert c.validate_token(resource, g.token).state == TokenState.CURRENT
        assert [e.token for e in c.history(resource)] == [g.token]
        with pytest.raises(PermissionDenied):
            c.validate_token("billing/2026-07", 1)
        with pytest.raises(PermissionDenied):
            c.validate_tokens([(resource, g.token), ("billing/2026-07", 1)])
        with pytest.raises(PermissionDenied):
            c.history("billing/2026-07")
        with pytest.raises(PermissionDenied) as e:
            next(iter(c.watch("")))  # every resource: more than py/
        assert "py/" in str(e.value), str(e.value)
        # Under its own prefix the stream works, over TLS with the token.
        with c.watch(resource + "/") as w:
            got = []
            t = threading.Thread(target=lambda: got.append(next(w)), daemon=True)
            t.start()
            assert w.started.wait(10)
            c.acquire(resource + "/w", ttl=10)
            t.join(10)
            assert got and got[0].kind == EventKind.GRANTED and got[0].resource == resource + "/w"
    with secure.client(ca=ca) as c:
        with pytest.raises(Unauthenticated):
            next(iter(c.watch(resource)))
        with pytest.raises(Unauthenticated):
            c.validate_token(resource, 1)
