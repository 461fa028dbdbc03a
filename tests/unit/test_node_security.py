"""Shared token and mutual TLS on real gRPC servers on loopback: strangers are refused before any
handler runs, members get through. Certificates are made with the openssl command line."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from gwtf.node.rpc.security import (
    Credentials,
    SecurityError,
    TokenClientInterceptors,
    TokenServerInterceptor,
    channel_credentials,
    load_credentials,
    secure_channel_options,
    server_credentials,
)
from gwtf.node.rpc.server import HealthServicer, ProbeServicer
from gwtf.v1 import health_pb2, health_pb2_grpc, node_pb2, node_pb2_grpc
from tests.integration.pki import make_ca, make_member

TOKEN = "0123456789abcdef0123456789abcdef"


class CountingProbe(ProbeServicer):
    """The node's echo, counting the requests that reached it."""

    def __init__(self) -> None:
        self.seen = 0

    async def Echo(self, request: Any, context: aio.ServicerContext) -> Any:
        self.seen += 1
        return await super().Echo(request, context)


def serve(
    server_creds: Credentials,
    test: Callable[[str, CountingProbe], Awaitable[None]],
) -> None:
    async def main() -> None:
        interceptors = [TokenServerInterceptor(server_creds.token)] if server_creds.token else []
        server = aio.server(interceptors=interceptors)
        probe = CountingProbe()
        health = HealthServicer()
        health.set_serving(True)
        node_pb2_grpc.add_ProbeServicer_to_server(probe, server)
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        tls = server_credentials(server_creds)
        if tls is None:
            port = server.add_insecure_port("127.0.0.1:0")
        else:
            port = server.add_secure_port("127.0.0.1:0", tls)
        await server.start()
        try:
            await test(f"127.0.0.1:{port}", probe)
        finally:
            await server.stop(None)

    asyncio.run(asyncio.wait_for(main(), 60))


def channel(address: str, creds: Credentials) -> aio.Channel:
    interceptors = TokenClientInterceptors(creds.token)
    tls = channel_credentials(creds)
    if tls is None:
        return aio.insecure_channel(address, interceptors=interceptors)
    return aio.secure_channel(
        address, tls, options=secure_channel_options(creds), interceptors=interceptors
    )


async def echo(address: str, creds: Credentials) -> grpc.StatusCode:
    async with channel(address, creds) as ch:
        try:
            await node_pb2_grpc.ProbeStub(ch).Echo(node_pb2.EchoRequest(nonce=7), timeout=5)
        except aio.AioRpcError as err:
            return err.code()
    return grpc.StatusCode.OK


async def watch(address: str, creds: Credentials) -> grpc.StatusCode:
    """A server-streaming call: refused the same way as a unary one."""
    async with channel(address, creds) as ch:
        call = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=5)
        try:
            await call.read()
        except aio.AioRpcError as err:
            return err.code()
        call.cancel()
    return grpc.StatusCode.OK


def test_the_token_is_required_on_every_call() -> None:
    async def check(address: str, probe: CountingProbe) -> None:
        assert await echo(address, Credentials()) == grpc.StatusCode.UNAUTHENTICATED
        assert await echo(address, Credentials(token="x" * 32)) == grpc.StatusCode.UNAUTHENTICATED
        assert await watch(address, Credentials()) == grpc.StatusCode.UNAUTHENTICATED
        assert probe.seen == 0  # nothing a stranger sent reached the handler
        assert await echo(address, Credentials(token=TOKEN)) == grpc.StatusCode.OK
        assert await watch(address, Credentials(token=TOKEN)) == grpc.StatusCode.OK
        assert probe.seen == 1

    serve(Credentials(token=TOKEN), check)


def test_the_refusal_says_why_in_one_line() -> None:
    async def check(address: str, probe: CountingProbe) -> None:
        async with channel(address, Credentials(token="y" * 32)) as ch:
            with pytest.raises(aio.AioRpcError) as info:
                await node_pb2_grpc.ProbeStub(ch).Echo(node_pb2.EchoRequest(), timeout=5)
        assert info.value.details() == "wrong token: this swarm requires its token (--token-file)"

    serve(Credentials(token=TOKEN), check)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Credentials]:
    folder = tmp_path_factory.mktemp("pki")
    ours, theirs = make_ca(folder, "ours"), make_ca(folder, "theirs")
    return {
        name: load_credentials(None, *map(str, make_member(folder, name, ca)))
        for name, ca in (("server", ours), ("client", ours), ("stranger", theirs))
    }


def test_mutual_tls_admits_members_and_refuses_strangers(pki: dict[str, Credentials]) -> None:
    async def check(address: str, probe: CountingProbe) -> None:
        assert await echo(address, pki["client"]) == grpc.StatusCode.OK
        # A certificate from another CA, or none at all: the handshake fails.
        assert await echo(address, pki["stranger"]) == grpc.StatusCode.UNAVAILABLE
        assert await echo(address, Credentials()) == grpc.StatusCode.UNAVAILABLE
        assert probe.seen == 1

    serve(pki["server"], check)


def test_tls_and_token_together(pki: dict[str, Credentials]) -> None:
    server = Credentials(TOKEN, pki["server"].cert, pki["server"].key, pki["server"].ca)
    member = Credentials(TOKEN, pki["client"].cert, pki["client"].key, pki["client"].ca)
    wrong = Credentials("z" * 32, pki["client"].cert, pki["client"].key, pki["client"].ca)

    async def check(address: str, probe: CountingProbe) -> None:
        assert await echo(address, member) == grpc.StatusCode.OK
        assert await echo(address, wrong) == grpc.StatusCode.UNAUTHENTICATED
        assert probe.seen == 1

    serve(server, check)


def test_bad_credential_files_are_one_line_errors(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("abc\n")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    good = tmp_path / "token"
    good.write_text(TOKEN + "\n")
    assert load_credentials(str(good)).token == TOKEN
    cases = [
        ((str(tmp_path / "missing"),), "--token-file"),
        ((str(short),), "at least 16"),
        ((None, str(garbage), str(garbage), str(garbage)), "not a PEM file"),
        ((None, str(garbage)), "needs all three"),
    ]
    for args, message in cases:
        with pytest.raises(SecurityError, match=message) as info:
            load_credentials(*args)
        assert "\n" not in str(info.value)
