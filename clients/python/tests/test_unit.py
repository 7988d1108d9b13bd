"""Pure parts: the keeper's safe-until arithmetic on a fake clock, the
error mapping, and the input rules."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import grpc
import pytest

from baton import errors
from baton.client import Client, Lease, _leader_hint, map_error
from baton.keeper import Keeper, margin_s, safe_until
from baton.rules import check_holder, check_resource, millis, parse_duration


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class ScriptedClient:
    """Answers renewals from a script; records the timeouts it was given."""

    def __init__(self, clock: FakeClock, answers: list[Any]) -> None:
        self.clock = clock
        self.answers = answers
        self.timeout_s = 10.0
        self.timeouts: list[float | None] = []
        self.released: list[Lease] = []

    def renew(self, lease: Lease, timeout_s: float | None = None) -> Lease:
        self.timeouts.append(timeout_s)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        # The server granted `answer` seconds from the renewal's arrival.
        return Lease(
            lease.resource, lease.acquisition_id, lease.token, lease.ttl_s, self.clock.now + answer
        )

    def release(self, lease: Lease) -> bool:
        self.released.append(lease)
        return True


def lease(clock: FakeClock, ttl_s: float = 30.0) -> Lease:
    return Lease("r", b"\x01" * 16, 7, ttl_s, clock.now + ttl_s)


def test_the_margin_is_five_percent_and_at_least_ten_ms() -> None:
    assert margin_s(30.0) == pytest.approx(1.5)
    assert margin_s(0.1) == pytest.approx(0.010)
    assert safe_until(10.0, 30.0, 1.5) == pytest.approx(38.5)


def test_safe_until_counts_from_each_acknowledged_renewal_and_never_moves_back() -> None:
    clock = FakeClock()
    client = ScriptedClient(clock, [30.0, errors.Indeterminate("lost answer"), 30.0])
    k = Keeper(client, lease(clock), clock=clock, start=False)  # type: ignore[arg-type]
    assert k.safe_until == pytest.approx(128.5)
    clock.now = 110.0
    k.renew_once()
    assert k.safe_until == pytest.approx(138.5)
    # An unknown outcome teaches nothing: the old safe-until stays.
    clock.now = 120.0
    k.renew_once()
    assert k.safe_until == pytest.approx(138.5)
    # The renewal's budget is what is left before the safe-until.
    assert client.timeouts[1] == pytest.approx(10.0)
    clock.now = 137.0
    k.renew_once()
    assert client.timeouts[2] == pytest.approx(1.5)
    assert k.safe_until == pytest.approx(165.5)
    k.check()


def test_a_keeper_that_passed_its_safe_until_never_vouches_again() -> None:
    clock = FakeClock()
    client = ScriptedClient(clock, [30.0])
    k = Keeper(client, lease(clock), clock=clock, start=False)  # type: ignore[arg-type]
    clock.now = 128.5
    with pytest.raises(errors.OwnershipLost, match="safe-until"):
        k.check()
    assert k.lost.is_set()
    # A renewal that would have succeeded is not even sent now.
    k.renew_once()
    assert client.timeouts == []
    clock.now = 100.0
    with pytest.raises(errors.OwnershipLost):
        k.check()


def test_not_owner_loses_the_lease_at_once() -> None:
    clock = FakeClock()
    client = ScriptedClient(clock, [errors.NotOwner("fenced")])
    k = Keeper(client, lease(clock), clock=clock, start=False)  # type: ignore[arg-type]
    k.renew_once()
    assert k.lost.is_set()
    with pytest.raises(errors.OwnershipLost, match="no longer knows"):
        k.check()
    # Released on exit only if not lost (a lost lease is not ours to release).
    k.__exit__(None, None, None)
    assert client.released == []


def test_a_grant_already_past_its_safe_until_is_lost_from_the_start() -> None:
    clock = FakeClock()
    late = Lease("r", b"\x01" * 16, 7, 1.0, clock.now + 0.04)
    k = Keeper(ScriptedClient(clock, []), late, clock=clock, start=False)  # type: ignore[arg-type]
    assert not k.is_owner()


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, trailing: Any = ()) -> None:
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._trailing


class Metadatum(NamedTuple):
    key: str
    value: str


@pytest.mark.parametrize(
    ("code", "details", "kind", "definite"),
    [
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", errors.Indeterminate, False),
        (grpc.StatusCode.UNAVAILABLE, "Socket closed", errors.Indeterminate, False),
        (
            grpc.StatusCode.UNAVAILABLE,
            "failed to connect to all addresses; last error: Connection refused",
            errors.Unavailable,
            True,
        ),
        (grpc.StatusCode.INVALID_ARGUMENT, "ttl 5ms is out of range", errors.InvalidArgument, True),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "too many waiters", errors.Exhausted, True),
        (grpc.StatusCode.UNAUTHENTICATED, "unknown token", errors.Unauthenticated, True),
        (grpc.StatusCode.PERMISSION_DENIED, "no rule", errors.PermissionDenied, True),
        (grpc.StatusCode.INTERNAL, "boom", errors.Indeterminate, False),
    ],
)
def test_errors_map_to_definite_or_indeterminate(
    code: grpc.StatusCode, details: str, kind: type, definite: bool
) -> None:
    e = map_error(FakeRpcError(code, details), "127.0.0.1:7700", 10.0)
    assert isinstance(e, kind)
    assert e.definite is definite
    assert details in str(e) or "within 10 s" in str(e)


def test_a_followers_answer_names_the_leader() -> None:
    follower = FakeRpcError(
        grpc.StatusCode.UNAVAILABLE, "not the leader", (Metadatum("baton-leader", "b:7700"),)
    )
    assert _leader_hint(follower) == "b:7700"
    # grpc.aio gives plain pairs.
    aio_follower = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "x", (("baton-leader", "c:7700"),))
    assert _leader_hint(aio_follower) == "c:7700"
    assert _leader_hint(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "x")) is None
    assert _leader_hint(FakeRpcError(grpc.StatusCode.INTERNAL, "x")) is None


def test_client_configuration_follows_the_command_lines_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("BATON_SERVER", "http://a:7700, b:7701")
    monkeypatch.setenv("BATON_TIMEOUT", "1500ms")
    monkeypatch.setenv("BATON_HOLDER", "py worker 1")
    c = Client()
    assert c.current_server() == "a:7700"
    assert c._addresses == ["a:7700", "b:7701"]
    assert c.timeout_s == pytest.approx(1.5)
    assert c.holder == "py worker 1"
    empty = tmp_path / "token"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        Client(token_file=str(empty))
    with pytest.raises(ValueError, match="both cert_file and key_file"):
        Client(cert_file="c.pem")
    monkeypatch.setenv("BATON_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="like 500ms"):
        Client()


def test_input_rules_name_the_rule() -> None:
    assert check_resource("cafe\u0301") == "caf\u00e9"
    for bad, rule in [
        ("", "empty"),
        (" a", "whitespace"),
        ("a::b", "empty ':'-separated segment at byte 2"),
        ("a\nb", "control character U+000A at byte 1"),
        ("x" * 513, "513 bytes long"),
    ]:
        with pytest.raises(ValueError, match=re.escape(rule)):
            check_resource(bad)
    with pytest.raises(ValueError, match="257 bytes"):
        check_holder("h" * 257)
    with pytest.raises(ValueError, match="U\\+0007"):
        check_holder("a\x07")
    assert millis(0.0011, "ttl") == 2, "rounded up: never shorter than asked"
    with pytest.raises(ValueError, match="positive"):
        millis(0, "ttl")
    with pytest.raises(ValueError, match="a year"):
        millis(10**9, "wait", zero_ok=True)
    assert parse_duration("5m", "x") == 300.0


@pytest.mark.parametrize(
    ("raw", "address"),
    [
        ("127.0.0.1:7700", "127.0.0.1:7700"),
        ("localhost", "localhost:7700"),
        ("http://localhost", "localhost:7700"),
        ("https://db1:9000/", "db1:9000"),
        ("7800", "127.0.0.1:7800"),
        ("[::1]", "[::1]:7700"),
        ("[::1]:7701", "[::1]:7701"),
    ],
)
def test_addresses_take_the_forms_users_write(raw: str, address: str) -> None:
    assert Client(raw).current_server() == address


@pytest.mark.parametrize(
    ("raw", "rule"),
    [
        ("127.0.0.1:99999", "port 99999 is out of range; a port is 1 to 65535"),
        ("0", "port 0 is out of range"),
        ("host:http", "is not a number"),
        ("::1", "in brackets, like [::1]:7700"),
        ("[::1", "closing ']'"),
        ("ftp://host:1", "is not http or https"),
        ("http://host:1/path", "not an address"),
        (":7700", "no host"),
    ],
)
def test_bad_addresses_are_refused_before_anything_is_sent(raw: str, rule: str) -> None:
    with pytest.raises(ValueError, match=rule.replace("[", r"\[").replace("(", r"\(")):
        Client(raw)


def test_the_dial_timeout_is_positive(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Client("a:1", dial_timeout_s=0.25).dial_timeout_s == 0.25
    monkeypatch.setenv("BATON_DIAL_TIMEOUT", "300ms")
    assert Client("a:1").dial_timeout_s == pytest.approx(0.3)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="must be positive"):
            Client("a:1", dial_timeout_s=bad)


@pytest.mark.parametrize(
    ("name", "code_point"),
    [("rtl:\u202egnp.exe", "202E"), ("zw:a\u200bb", "200B"), ("tag:\U000e0041", "E0041")],
)
def test_invisible_characters_are_refused_in_new_names_naming_the_rule(
    name: str, code_point: str
) -> None:
    with pytest.raises(ValueError, match=f"invisible or formatting character U\\+{code_point}"):
        check_resource(name)
    # A lease stored under it by an earlier release can still be reached.
    assert check_resource(name, existing=True) == name
    with pytest.raises(ValueError, match="invisible or formatting character"):
        check_holder(f"job{name}")
    assert check_resource("zw:ab") == "zw:ab"
