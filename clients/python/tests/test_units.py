"""What needs no cluster: options, errors, endpoints, the clock, tokens."""

import time

import pytest

from fenced_client import (
    SUSPEND_AWARE,
    Client,
    EndpointError,
    InvalidArgument,
    LeaseOptions,
    TlsError,
    bearer_token_from_env,
    clock_now,
)


def test_lease_options_defaults_match_the_rust_client():
    opts = LeaseOptions()
    assert opts.renew_interval(30) == 10
    assert opts.safety_margin(30) == 3
    assert opts.safety_margin(0.5) == 0.1  # at least 100 ms
    assert LeaseOptions(margin=5).safety_margin(2) == 2  # at most the TTL
    assert LeaseOptions(jitter=False).jittered(3.0) == 3.0
    for _ in range(100):
        assert 2.7 <= opts.jittered(3.0) <= 3.3


def test_invalid_argument_names_the_field():
    e = InvalidArgument("ttl_ms: 500 is below the minimum 1000")
    assert e.field == "ttl_ms" and "1000" in str(e)
    assert InvalidArgument("something else").field is None


def test_the_lease_clock_counts_suspend_on_linux():
    import sys

    if sys.platform.startswith("linux"):
        assert SUSPEND_AWARE
        assert abs(clock_now() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 0.1
    a = clock_now()
    time.sleep(0.01)
    assert clock_now() - a >= 0.009


def test_endpoints_must_match_the_tls_settings():
    with pytest.raises(EndpointError) as e:
        Client(["https://127.0.0.1:7101"], env=False)
    assert "https:// needs the CA" in str(e.value)
    with pytest.raises(EndpointError):
        Client([" ", ""], env=False)
    with pytest.raises(EndpointError):
        Client(["127.0.0.1"], env=False)
    c = Client("127.0.0.1:7101, http://localhost:7102", env=False)
    assert c.endpoints == ["127.0.0.1:7101", "http://localhost:7102"]
    c.close()


def test_tls_settings_are_checked(tmp_path):
    with pytest.raises(TlsError) as e:
        Client(["127.0.0.1:7101"], env=False, ca=b"x", cert=b"y")
    assert "key" in str(e.value)
    with pytest.raises(TlsError) as e:
        Client(["127.0.0.1:7101"], env=False, ca=tmp_path / "missing.pem")
    assert "missing.pem" in str(e.value)


def test_bearer_token_from_env(monkeypatch, tmp_path):
    monkeypatch.delenv("FENCED_TOKEN", raising=False)
    monkeypatch.delenv("FENCED_TOKEN_FILE", raising=False)
    assert bearer_token_from_env() is None
    f = tmp_path / "t"
    f.write_text("  tok-1  \nsecond\n")
    monkeypatch.setenv("FENCED_TOKEN_FILE", str(f))
    assert bearer_token_from_env() == "tok-1"
    monkeypatch.setenv("FENCED_TOKEN", "tok-2")
    assert bearer_token_from_env() == "tok-2"
    f.write_text("\n")
    monkeypatch.delenv("FENCED_TOKEN")
    with pytest.raises(InvalidArgument) as e:
        bearer_token_from_env()
    assert "empty" in str(e.value)
    with pytest.raises(InvalidArgument) as e:
        Client(["127.0.0.1:7101"], env=False, token="bad token\n\x01")
    assert str(e.value).startswith("token:")


def test_a_token_is_not_sent_in_plaintext_to_a_remote_address(monkeypatch):
    monkeypatch.delenv("FENCED_TOKEN", raising=False)
    monkeypatch.delenv("FENCED_TOKEN_FILE", raising=False)
    for remote in [
        "10.0.0.5:7101",
        "http://10.0.0.5:7101",
        "lock.example.com:7101",
        "[2001:db8::1]:7101",
        "128.0.0.1:7101",
        "localhost.example.com:7101",
    ]:
        with pytest.raises(EndpointError) as e:
            Client(["127.0.0.1:7101", remote], env=False, token="secret")
        text = str(e.value)
        assert remote in text and "plaintext" in text and "https://" in text, text
        assert "secret" not in text
    # From the environment too.
    monkeypatch.setenv("FENCED_TOKEN", "secret")
    with pytest.raises(EndpointError):
        Client(["10.0.0.5:7101"])
    monkeypatch.delenv("FENCED_TOKEN")
    # Loopback is allowed, and any address without a token.
    for local in ["127.0.0.1:7101", "127.8.9.10:7101", "localhost:7101", "LOCALHOST:7101", "[::1]:7101", "http://[::1]:7101"]:
        Client([local], env=False, token="secret").close()
    Client(["10.0.0.5:7101"], env=False).close()
