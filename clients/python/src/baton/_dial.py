"""How a client reaches one server: the address forms users write, and a
dial that proves the server answers before a request is sent to it.

A stopped server (SIGSTOP, a frozen VM) still completes TCP handshakes, so
an open connection proves nothing. A dial resolves the name and connects
(a refusal or a failed lookup is known at once), then waits for the gRPC
channel to be READY, which gRPC reaches only once the server has sent its
HTTP/2 SETTINGS, all within the dial timeout. Every failure here happens
before anything was sent: the error is definite."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

import grpc

PORT_DEFAULT = 7700
DIAL_TIMEOUT_DEFAULT_S = 1.0
ADDRESS_RULE = (
    "write HOST, HOST:PORT, [IPv6]:PORT, a bare PORT (on 127.0.0.1), "
    "or a URL with http:// or https://"
)
REFUSED = (
    "connection refused: nothing listens there "
    "(is `baton serve` running, on this address and port?)"
)


def no_answer(dial_timeout_s: float) -> str:
    return (
        f"no answer within the dial timeout of {dial_timeout_s * 1000:.0f} ms: the server is "
        "stopped or hung, or this is not Baton's gRPC port (clients use --listen, 7700 by "
        "default; Baton's HTTP port and a TLS port wait for the client to speak first)"
    )


def _port(text: str, bad: type[ValueError], where: str) -> int:
    if not text or not all(c in "0123456789" for c in text):
        raise bad(f"{where}: port {text!r} is not a number; a port is 1 to 65535")
    port = int(text)
    if not 1 <= port <= 65535:
        raise bad(f"{where}: port {port} is out of range; a port is 1 to 65535")
    return port


def address(url: str) -> str:
    """``host:port`` as gRPC dials it, from an address as users write it:
    ``HOST`` and ``http://HOST`` mean port 7700, a bare ``PORT`` means
    ``127.0.0.1:PORT``, ``[::1]`` and ``[::1]:PORT`` are IPv6. Raises
    ``ValueError`` naming the rule for anything else."""
    text = url.strip()
    where = f"server address {text!r}"
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    elif scheme.lower() not in ("http", "https"):
        raise ValueError(f"{where}: the scheme {scheme!r} is not http or https; {ADDRESS_RULE}")
    authority = rest[:-1] if rest.endswith("/") else rest
    if not authority or any(c in authority for c in "/?#@"):
        raise ValueError(f"{where}: not an address; {ADDRESS_RULE}")
    if not scheme and all(c in "0123456789" for c in authority):
        return f"127.0.0.1:{_port(authority, ValueError, where)}"
    port_text: str | None
    if authority.startswith("["):
        inside, closed, after = authority[1:].partition("]")
        if not closed:
            raise ValueError(f"{where}: an IPv6 address needs its closing ']'; {ADDRESS_RULE}")
        try:
            ipaddress.IPv6Address(inside)
        except ValueError:
            raise ValueError(f"{where}: [{inside}] is not an IPv6 address") from None
        if after and not after.startswith(":"):
            raise ValueError(f"{where}: expected ':PORT' after the IPv6 address; {ADDRESS_RULE}")
        host, port_text = f"[{inside}]", (after[1:] if after else None)
    else:
        host, colon, port_text = authority.partition(":")
        if ":" in port_text:
            raise ValueError(
                f"{where}: write an IPv6 address in brackets, like [::1]:7700; {ADDRESS_RULE}"
            )
        port_text = port_text if colon else None
    if not host:
        raise ValueError(f"{where}: no host; {ADDRESS_RULE}")
    port = PORT_DEFAULT if port_text is None else _port(port_text, ValueError, where)
    return f"{host}:{port}"


def host_port(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def _why(e: BaseException, host: str, dial_timeout_s: float) -> str:
    if isinstance(e, socket.gaierror):
        return f"{host} does not resolve: {e.strerror or e}"
    if isinstance(e, ConnectionRefusedError):
        return REFUSED
    if isinstance(e, (TimeoutError, asyncio.TimeoutError, socket.timeout)):
        return no_answer(dial_timeout_s)
    return str(e) or type(e).__name__


def tcp_check(addr: str, dial_timeout_s: float) -> str | None:
    """None if ``addr`` resolves and takes a TCP connection within the
    dial timeout; otherwise why not."""
    host, port = host_port(addr)
    try:
        socket.create_connection((host, port), timeout=dial_timeout_s).close()
    except OSError as e:
        return _why(e, host, dial_timeout_s)
    return None


async def tcp_check_async(addr: str, dial_timeout_s: float) -> str | None:
    """:func:`tcp_check` for an event loop."""
    host, port = host_port(addr)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), dial_timeout_s)
    except (OSError, asyncio.TimeoutError) as e:
        return _why(e, host, dial_timeout_s)
    writer.close()
    return None


def close_channel(channel: grpc.Channel) -> None:
    """Closes a channel without a traceback from gRPC's connectivity poller.

    A readiness wait (``grpc.channel_ready_future``) subscribed while the
    channel's poller thread still runs from an earlier wait sets the
    poller's ``try_to_connect``; a poller that wakes on a closed channel
    with it set asks the closed channel for its state and dies with
    ``ValueError: Cannot invoke RPC: Channel closed!``, printed as an
    unhandled exception in a thread (grpc/grpc#18995). Cleared under the
    poller's lock while the channel closes, the poller ends at its next
    wake instead. That state is gRPC's own, not its API: on a version
    without it the channel is closed as it is."""
    state: Any = getattr(channel, "_connectivity_state", None)
    if not (hasattr(state, "lock") and hasattr(state, "try_to_connect")):
        channel.close()
        return
    with state.lock:
        state.try_to_connect = False
        channel.close()
