"""Who may talk to a swarm: a shared token and mutual TLS (`--token-file`, `--tls-*`).

A volunteer swarm listens on public addresses, so a node must be able to refuse strangers before
anything they send touches its state. Two mechanisms, usable together:

- *Shared token.* Every call carries `authorization: Bearer <token>` in its metadata (a client
  interceptor adds it) and a server interceptor checks it before any handler runs, in constant
  time (`hmac.compare_digest`). A call without it, or with another token, ends UNAUTHENTICATED,
  and the handler never sees the request. The token is read from a file, never from the command
  line, where `ps` would show it to every user of the machine.
- *Mutual TLS.* The server presents `--tls-cert`/`--tls-key` and requires a client certificate
  signed by `--tls-ca`; clients present theirs and check the server's against the same CA. One CA
  per swarm: whoever holds a certificate it signed is a member. Host names are not checked
  against the certificate (volunteers are reached by IP address); the CA is the identity.

The token is checked on every RPC, health checks included: an unauthenticated prober learns
nothing about the swarm, not even that a node is up.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

__all__ = [
    "AUTH_METADATA",
    "Credentials",
    "SecurityError",
    "TokenClientInterceptors",
    "TokenServerInterceptor",
    "add_port",
    "channel_credentials",
    "credentials_from_args",
    "guarded",
    "load_credentials",
    "open_channel",
    "server_credentials",
]

AUTH_METADATA = "authorization"
MIN_TOKEN_BYTES = 16
"""A shorter token is refused at start-up: it could be guessed by trying."""
MAX_FILE_BYTES = 1 << 20


class SecurityError(ValueError):
    """A credential file is missing, unreadable or unusable; the message says which, in a line."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a node or a client presents and requires. Empty: an open swarm (loopback tests)."""

    token: str | None = None
    cert: bytes | None = None  # PEM certificate chain of this end
    key: bytes | None = None  # PEM private key of this end
    ca: bytes | None = None  # PEM CA that signs every member's certificate

    @property
    def tls(self) -> bool:
        return self.cert is not None


def _read(flag: str, path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise SecurityError(f"{flag} {path!r}: {err.strerror or err}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SecurityError(f"{flag} {path!r}: larger than {MAX_FILE_BYTES} bytes")
    return data


def load_credentials(
    token_file: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
) -> Credentials:
    """Read the files the flags name; SecurityError if one is missing, empty or malformed."""
    token = None
    if token_file is not None:
        raw = _read("--token-file", token_file)
        try:
            token = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            raise SecurityError(f"--token-file {token_file!r}: the token must be ASCII") from None
        if len(token) < MIN_TOKEN_BYTES or not token.isprintable() or " " in token:
            raise SecurityError(
                f"--token-file {token_file!r}: the token must be one word of at least "
                f"{MIN_TOKEN_BYTES} printable characters (e.g. `openssl rand -hex 32`)"
            )
    given = [f for f, v in (("--tls-cert", tls_cert), ("--tls-key", tls_key),
                            ("--tls-ca", tls_ca)) if v is not None]  # fmt: skip
    if given and len(given) != 3:
        raise SecurityError("mutual TLS needs all three of --tls-cert, --tls-key and --tls-ca")
    cert = key = ca = None
    if tls_cert and tls_key and tls_ca:
        cert, key, ca = (_read("--tls-cert", tls_cert), _read("--tls-key", tls_key),
                         _read("--tls-ca", tls_ca))  # fmt: skip
        for flag, path, data, marker in (
            ("--tls-cert", tls_cert, cert, b"-----BEGIN CERTIFICATE-----"),
            ("--tls-key", tls_key, key, b"PRIVATE KEY-----"),
            ("--tls-ca", tls_ca, ca, b"-----BEGIN CERTIFICATE-----"),
        ):
            if marker not in data:
                raise SecurityError(f"{flag} {path!r}: not a PEM file")
    return Credentials(token, cert, key, ca)


def server_credentials(creds: Credentials) -> grpc.ServerCredentials | None:
    """TLS credentials for a node's port (None: plain TCP), client certificates required."""
    if not creds.tls:
        return None
    assert creds.key is not None and creds.cert is not None
    return grpc.ssl_server_credentials(
        [(creds.key, creds.cert)], root_certificates=creds.ca, require_client_auth=True
    )


def channel_credentials(creds: Credentials) -> grpc.ChannelCredentials | None:
    """TLS credentials for a channel to a node (None: plain TCP)."""
    if not creds.tls:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=creds.ca, private_key=creds.key, certificate_chain=creds.cert
    )


# Certificates name the swarm, not a host: volunteers are reached by IP address. gRPC checks the
# peer's certificate against the CA and this name against the certificate's subject.
TLS_TARGET_NAME = "gwtf-swarm"


def secure_channel_options(creds: Credentials) -> list[tuple[str, Any]]:
    """Extra channel options for TLS: the name every member's certificate carries."""
    return [("grpc.ssl_target_name_override", TLS_TARGET_NAME)] if creds.tls else []


class TokenServerInterceptor(aio.ServerInterceptor):
    """Refuses with UNAUTHENTICATED every call whose metadata lacks the swarm's token."""

    def __init__(self, token: str, on_refuse: Callable[[], None] | None = None) -> None:
        self._expected = f"Bearer {token}".encode()
        self._on_refuse = on_refuse  # counts refusals (the node's metrics)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        given = b""
        for key, value in details.invocation_metadata or ():
            if key == AUTH_METADATA:
                given = value.encode() if isinstance(value, str) else bytes(value)
                break
        handler = await continuation(details)
        if hmac.compare_digest(given, self._expected) or handler is None:
            return handler  # (None: an unknown method, which grpc answers UNIMPLEMENTED)
        if self._on_refuse is not None:
            self._on_refuse()
        return _refusal(handler, "missing token" if not given else "wrong token")


def _refusal(handler: grpc.RpcMethodHandler, why: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that aborts UNAUTHENTICATED at once, before it
    reads anything the caller sent."""
    message = f"{why}: this swarm requires its token (--token-file)"

    async def refuse(context: aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return guarded(handler, refuse)


def guarded(
    handler: grpc.RpcMethodHandler, check: Callable[[aio.ServicerContext], Awaitable[None]]
) -> grpc.RpcMethodHandler:
    """`handler`, of whichever of the four kinds, behind `check(context)`: awaited before the
    behaviour runs and before a streamed request is read; `check` refuses the call by aborting
    it. (The server interceptors that gate calls, the token here and the rate limit, share it.)"""
    de, se = handler.request_deserializer, handler.response_serializer
    if handler.unary_unary is not None:
        unary_unary = handler.unary_unary

        async def checked_unary_unary(request: Any, context: aio.ServicerContext) -> Any:
            await check(context)
            return await unary_unary(request, context)

        return grpc.unary_unary_rpc_method_handler(checked_unary_unary, de, se)
    if handler.unary_stream is not None:
        unary_stream = handler.unary_stream

        async def checked_unary_stream(request: Any, context: aio.ServicerContext) -> Any:
            await check(context)
            async for reply in unary_stream(request, context):
                yield reply

        return grpc.unary_stream_rpc_method_handler(checked_unary_stream, de, se)
    if handler.stream_unary is not None:
        stream_unary = handler.stream_unary

        async def checked_stream_unary(requests: Any, context: aio.ServicerContext) -> Any:
            await check(context)
            return await stream_unary(requests, context)

        return grpc.stream_unary_rpc_method_handler(checked_stream_unary, de, se)
    stream_stream = handler.stream_stream

    async def checked_stream_stream(requests: Any, context: aio.ServicerContext) -> Any:
        await check(context)
        async for reply in stream_stream(requests, context):
            yield reply

    return grpc.stream_stream_rpc_method_handler(checked_stream_stream, de, se)


class _TokenAdder:
    def __init__(self, token: str) -> None:
        self._pair = (AUTH_METADATA, f"Bearer {token}")

    def _details(self, details: aio.ClientCallDetails) -> aio.ClientCallDetails:
        metadata = list(details.metadata or ()) + [self._pair]
        return aio.ClientCallDetails(
            details.method, details.timeout, aio.Metadata(*metadata), details.credentials,
            details.wait_for_ready,
        )  # fmt: skip


class _UnaryUnary(_TokenAdder, aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _UnaryStream(_TokenAdder, aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _StreamUnary(_TokenAdder, aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


class _StreamStream(_TokenAdder, aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


def TokenClientInterceptors(token: str | None) -> list[aio.ClientInterceptor]:  # noqa: N802
    """Client interceptors that add the token to every kind of call (none without a token)."""
    if token is None:
        return []
    return [_UnaryUnary(token), _UnaryStream(token), _StreamUnary(token), _StreamStream(token)]


def credentials_from_args(args: object) -> Credentials:
    """The credentials the `--token-file` and `--tls-*` flags of a command name."""
    return load_credentials(
        getattr(args, "token_file", None),
        getattr(args, "tls_cert", None),
        getattr(args, "tls_key", None),
        getattr(args, "tls_ca", None),
    )


def open_channel(
    address: str,
    creds: Credentials,
    *,
    options: Sequence[tuple[str, Any]] = (),
    interceptors: Sequence[aio.ClientInterceptor] = (),
) -> aio.Channel:
    """A channel to a node that presents `creds` on every call (TLS and/or the token)."""
    chain = [*TokenClientInterceptors(creds.token), *interceptors]
    tls = channel_credentials(creds)
    if tls is None:
        return aio.insecure_channel(address, options=list(options), interceptors=chain)
    return aio.secure_channel(
        address, tls, options=[*options, *secure_channel_options(creds)], interceptors=chain
    )


def add_port(server: aio.Server, address: str, creds: Credentials) -> int:
    """Bind `address` with TLS when `creds` has it; the port (0 if it cannot be bound)."""
    tls = server_credentials(creds)
    if tls is None:
        return int(server.add_insecure_port(address))
    return int(server.add_secure_port(address, tls))
