"""The pieces of the dashboard's access checks on their own: the Host header's name,
the names a UI answers to, and the failed sign-in limit on a clock the test moves."""

from __future__ import annotations

import pytest

from dashboard.auth import LOOPBACK_NAMES, LoginLimiter, host_of, served_hosts


@pytest.mark.parametrize(
    "header,expected",
    [
        ("127.0.0.1:8050", ("127.0.0.1", 8050)),
        ("localhost", ("localhost", None)),
        ("LocalHost:80", ("localhost", 80)),
        ("[::1]:8050", ("::1", 8050)),
        ("[0:0:0:0:0:0:0:1]", ("::1", None)),
        ("dash.example.com:443", ("dash.example.com", 443)),
        ("", None),
        (None, None),
        ("::1", None),  # an IPv6 address needs brackets
        ("[::1", None),
        ("[not-v6]:80", None),
        ("[::1]x", None),
        ("host:port", None),
        ("host:123456", None),
        ("user@host", None),
        ("a b", None),
        ("host:٣", None),  # a digit, but not an ASCII one
    ],
)
def test_host_header_names(header: str | None, expected: tuple[str, int | None] | None) -> None:
    assert host_of(header) == expected


def test_the_names_a_ui_answers_to() -> None:
    assert served_hosts("127.0.0.1") == LOOPBACK_NAMES
    assert served_hosts("localhost") == LOOPBACK_NAMES
    assert served_hosts("127.0.0.2") == LOOPBACK_NAMES | {"127.0.0.2"}
    assert served_hosts("::1") == LOOPBACK_NAMES
    # On the network, the names it is reached by are not known: no check...
    assert served_hosts("0.0.0.0") is None
    assert served_hosts("10.1.2.3") is None
    # ...unless they are given.
    assert served_hosts("0.0.0.0", ["dash.example.com"]) == LOOPBACK_NAMES | {"dash.example.com"}
    assert served_hosts("10.1.2.3", ["Dash.Example.com"]) == LOOPBACK_NAMES | {
        "dash.example.com",
        "10.1.2.3",
    }
    assert served_hosts("::", ["[::1]"]) == LOOPBACK_NAMES


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_sign_in_limit_holds_a_client_for_its_window() -> None:
    clock = Clock()
    limiter = LoginLimiter(3, 60.0, clock=clock)
    for _ in range(3):
        assert limiter.retry_after("a") is None
        limiter.failed("a")
        clock.now += 10
    # Three failures at 1000, 1010, 1020; now 1030: held until the first is 60 s old.
    assert limiter.retry_after("a") == pytest.approx(30.0)
    assert limiter.retry_after("b") is None  # another client is not held
    clock.now = 1059.9
    assert limiter.retry_after("a") == pytest.approx(0.1)
    clock.now = 1060.0
    assert limiter.retry_after("a") is None  # two failures left in the window
    limiter.failed("a")
    assert limiter.retry_after("a") == pytest.approx(10.0)  # until 1010's is 60 s old
    limiter.succeeded("a")
    assert limiter.retry_after("a") is None


def test_the_sign_in_limit_remembers_a_bounded_number_of_clients() -> None:
    clock = Clock()
    limiter = LoginLimiter(1, 60.0, clock=clock, max_clients=100)
    for i in range(1000):
        limiter.failed(f"client-{i}")
    assert limiter.retry_after("client-999") is not None
    assert limiter.retry_after("client-900") is not None
    assert limiter.retry_after("client-0") is None  # dropped, the longest quiet
    assert len(limiter._failures) == 100
