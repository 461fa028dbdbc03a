"""The emulated WAN: one-way latency + size / bandwidth, a queue per peer, calibration."""

from __future__ import annotations

import pytest

from gwtf.flow.topology import LinkSpec
from gwtf.node.rpc.wan import CALIBRATION_MIN, ScheduleError, WanEmulator, parse_schedule

LINKS = {frozenset(("Oregon", "Tokyo")): LinkSpec(rtt_ms=96.0, bandwidth_gbps=0.5)}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_delay_is_half_the_rtt_plus_serialisation() -> None:
    wan = WanEmulator("Oregon", LINKS, Clock())
    assert wan.delay("t", "Tokyo", 0) == pytest.approx(0.048)
    # 1 MB at 0.5 Gbit/s: 16 ms on the wire.
    assert wan.delay("t2", "Tokyo", 1_000_000) == pytest.approx(0.048 + 0.016)


def test_same_location_is_the_intra_link_and_unknown_is_free() -> None:
    wan = WanEmulator("Oregon", LINKS, Clock())
    assert wan.delay("o", "Oregon", 0) == pytest.approx(0.0005)  # 1 ms RTT
    assert wan.delay("x", "Mars", 10**6) == 0.0  # not in the matrix: no link to emulate
    assert wan.delay("c", "", 10**6) == 0.0  # a client with no location (gwtf status)
    assert wan.link_to("Mars") is None and wan.knows("Tokyo") and not wan.knows("Mars")


def test_any_two_locations_read_the_same_link_from_either_end() -> None:
    # The commit's choice of exchange (gwtf.job.exchange) reads the link between two other
    # members: every node holding the matrix reads the same one.
    oregon, tokyo = WanEmulator("Oregon", LINKS, Clock()), WanEmulator("Tokyo", LINKS, Clock())
    for wan in (oregon, tokyo):
        assert wan.link("Tokyo", "Oregon") == wan.link("Oregon", "Tokyo") == LINKS[
            frozenset(("Oregon", "Tokyo"))]
        assert wan.link("Tokyo", "Tokyo") == wan.link("Oregon", "Oregon") == oregon.link_to(
            "Oregon")
        assert wan.link("Tokyo", "Mars") is None


def test_messages_to_one_peer_queue_behind_each_other() -> None:
    clock = Clock()
    wan = WanEmulator("Oregon", LINKS, clock)
    first = wan.delay("t", "Tokyo", 1_000_000)  # 16 ms on the wire
    second = wan.delay("t", "Tokyo", 0)  # waits for the first to be serialised
    assert second == pytest.approx(0.016 + 0.048)
    other = wan.delay("u", "Tokyo", 0)  # another peer: its own link
    assert other == pytest.approx(0.048)
    clock.now += 1.0  # the queue has drained
    assert wan.delay("t", "Tokyo", 0) == pytest.approx(0.048)
    assert first == pytest.approx(0.064)


def test_data_to_every_peer_queues_on_a_declared_uplink_control_does_not() -> None:
    links = {frozenset(("Oregon", "Tokyo")): LinkSpec(rtt_ms=96.0, bandwidth_gbps=1.0),
             frozenset(("Oregon", "Seoul")): LinkSpec(rtt_ms=124.0, bandwidth_gbps=1.0)}
    wan = WanEmulator("Oregon", links, Clock(), uplink_gbps=0.1)
    # 1 MB at the uplink's 0.1 Gbit/s, not the links' 1: 80 ms; the second, to another peer,
    # waits for the first on the uplink.
    assert wan.delay("t", "Tokyo", 1_000_000, data=True) == pytest.approx(0.048 + 0.080)
    assert wan.delay("s", "Seoul", 1_000_000, data=True) == pytest.approx(0.062 + 0.160)
    # A control message is not queued behind the data plane (at the uplink's rate still).
    assert wan.delay("s", "Seoul", 1_000, data=False) == pytest.approx(0.062 + 0.160 + 0.00008)
    assert wan.delay("x", "Tokyo", 1_000, data=False) == pytest.approx(0.048 + 0.00008)


def test_snapshots_queue_behind_each_other_apart_from_the_data_plane() -> None:
    wan = WanEmulator("Oregon", LINKS, Clock())
    # A 10 MB snapshot: 160 ms on the wire, after the snapshot before it, not in the way of
    # the activations to the same peer (docs/design.md 4.6, *Background*).
    assert wan.delay("t", "Tokyo", 10_000_000, bulk=True) == pytest.approx(0.160 + 0.048)
    assert wan.delay("t", "Tokyo", 0) == pytest.approx(0.048)
    assert wan.delay("t", "Tokyo", 10_000_000, bulk=True) == pytest.approx(0.320 + 0.048)


def test_calibration_subtracts_the_local_stack_once_measured_enough() -> None:
    wan = WanEmulator("Oregon", LINKS, Clock())
    for _ in range(CALIBRATION_MIN - 1):
        wan.calibrate(0.004)
    assert wan.stack_rtt_s == 0.0  # too few samples: start-up ones overstate it
    wan.calibrate(0.002)
    assert wan.stack_rtt_s == 0.002
    assert wan.delay("t", "Tokyo", 0) == pytest.approx(0.048 - 0.001)


# ---------------------------------------------------------------------- partitions

GEO = {
    frozenset(("Oregon", "Tokyo")): LinkSpec(rtt_ms=96.0, bandwidth_gbps=0.5),
    frozenset(("Oregon", "Virginia")): LinkSpec(rtt_ms=70.0, bandwidth_gbps=1.0),
    frozenset(("Virginia", "Tokyo")): LinkSpec(rtt_ms=150.0, bandwidth_gbps=0.5),
}


def schedule(at: float, duration: float = 30.0) -> str:
    return (f'[[partition]]\ngroups = [["Oregon", "Virginia"], ["Tokyo"]]\nat = {at}\n'
            f"duration_s = {duration}\n")


def test_a_partition_cuts_both_ways_between_its_groups_only_while_it_holds() -> None:
    wall = Clock()
    oregon = WanEmulator("Oregon", GEO, Clock(), wall=wall)
    tokyo = WanEmulator("Tokyo", GEO, Clock(), wall=wall)
    parts = parse_schedule(schedule(wall.now + 5), {"Oregon", "Virginia", "Tokyo"})
    oregon.partitions = tokyo.partitions = parts
    assert not oregon.cut("Tokyo") and not tokyo.cut("Oregon")  # not yet
    wall.now += 5
    assert oregon.cut("Tokyo") and tokyo.cut("Oregon") and tokyo.cut("Virginia")
    assert not oregon.cut("Virginia") and not oregon.cut("Oregon")  # within a group
    assert not oregon.cut("") and not tokyo.cut("Mars")  # clients, unknown places: never
    wall.now += 29.9
    assert oregon.cut("Tokyo")
    wall.now += 0.1  # healed
    assert not oregon.cut("Tokyo") and not tokyo.cut("Oregon")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("partition = 3", "array of tables"),
        ("[[partition]]\ngroups = [['Oregon'], ['Tokyo']]\nat = 1", "exactly groups"),
        ("[[partition]]\ngroups = [['Oregon'], ['Tokyo']]\nat = 1\nduration_s = 0",
         "duration_s above 0"),
        ("[[partition]]\ngroups = [['Oregon'], ['Mars']]\nat = 1\nduration_s = 3",
         "'Mars' is not in the link matrix"),
        ("[[partition]]\ngroups = [['Oregon'], ['Oregon', 'Tokyo']]\nat = 1\nduration_s = 3",
         "in both groups"),
        ("[[partition]]\ngroups = [['Oregon']]\nat = 1\nduration_s = 3", "two non-empty"),
        ("[[partition]]\ngroups = [['Oregon'], ['Tokyo']]\nat = 'now'\nduration_s = 3",
         "numbers of seconds"),
        ("cut = 1", "unknown key 'cut'"),
        ("[[partition", "not valid TOML"),
    ],
)
def test_a_bad_schedule_is_refused_in_one_sentence(text: str, says: str) -> None:
    with pytest.raises(ScheduleError, match=says) as err:
        parse_schedule(text, {"Oregon", "Virginia", "Tokyo"}, "s.toml")
    assert "\n" not in str(err.value) and str(err.value).startswith("s.toml")


def test_an_empty_schedule_is_no_partition() -> None:
    assert parse_schedule("", {"Oregon"}) == ()


def test_calls_across_a_cut_are_dropped_every_kind_and_pass_once_it_heals() -> None:
    """Real gRPC on loopback: a unary call, a reply stream and a request stream across a cut
    time out (dropped, not refused); a reply to a caller across a cut is never sent; a client
    with no location and calls after the heal get through."""
    import asyncio
    import time

    import grpc
    from grpc import aio

    from gwtf.node.rpc.server import HealthServicer, ProbeServicer
    from gwtf.node.rpc.transport import DROPPED, ChannelPool, WanServerInterceptor
    from gwtf.v1 import health_pb2, health_pb2_grpc, node_pb2, node_pb2_grpc

    wall = Clock()
    server_wan = WanEmulator("Tokyo", GEO, time.monotonic, wall=wall)
    client_wan = WanEmulator("Oregon", GEO, time.monotonic, wall=wall)
    cut = parse_schedule(schedule(wall.now, 10.0), {"Oregon", "Virginia", "Tokyo"})

    async def count(requests: object, context: aio.ServicerContext) -> node_pb2.EchoReply:
        n = 0
        async for _ in requests:  # type: ignore[attr-defined]
            n += 1
        return node_pb2.EchoReply(nonce=n)

    async def main() -> None:
        server = aio.server(interceptors=[WanServerInterceptor(server_wan)])
        health = HealthServicer()
        health.set_serving(True)
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        node_pb2_grpc.add_ProbeServicer_to_server(ProbeServicer(), server)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Count", {
            "Count": grpc.stream_unary_rpc_method_handler(
                count, request_deserializer=node_pb2.EchoRequest.FromString,
                response_serializer=node_pb2.EchoReply.SerializeToString),
        }),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        address = f"127.0.0.1:{port}"
        pool = ChannelPool("o1", "Oregon", client_wan)
        stubs = pool.stubs(address, "t1", "Tokyo")
        counting = stubs.channel.stream_unary(
            "/t.Count/Count", request_serializer=node_pb2.EchoRequest.SerializeToString,
            response_deserializer=node_pb2.EchoReply.FromString)
        check = health_pb2.HealthCheckRequest()
        echo = node_pb2.EchoRequest(nonce=7)

        async def dropped(call: object) -> float:
            began = time.monotonic()
            with pytest.raises(aio.AioRpcError) as err:
                await call  # type: ignore[misc]
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.value
            return time.monotonic() - began

        try:
            assert (await stubs.probe.Echo(echo, timeout=5)).nonce == 7
            assert (await counting(iter([echo] * 3), timeout=5)).nonce == 3
            client_wan.partitions = server_wan.partitions = cut
            assert await dropped(stubs.probe.Echo(echo, timeout=0.3)) >= 0.29
            async def first_of_watch() -> object:
                async for reply in stubs.health.Watch(check, timeout=0.3):
                    return reply
                return None
            assert await dropped(first_of_watch()) >= 0.29
            assert await dropped(counting(iter([echo] * 3), timeout=0.3)) >= 0.29
            with pytest.raises(aio.AioRpcError) as err:
                await stubs.probe.Echo(echo, timeout=0.2)
            assert err.value.details() == DROPPED
            # Only the server sees the cut: the request arrives, its reply is never sent.
            client_wan.partitions = ()
            await dropped(stubs.probe.Echo(echo, timeout=0.3))
            await dropped(counting(iter([echo] * 3), timeout=0.3))
            # A client with no location (gwtf status) is never cut.
            outsider = ChannelPool("cli", "", None).stubs(address)
            assert (await outsider.probe.Echo(echo, timeout=5)).nonce == 7
            wall.now += 10  # healed
            client_wan.partitions = cut
            assert (await stubs.probe.Echo(echo, timeout=5)).nonce == 7
            assert (await stubs.health.Check(check, timeout=5)).status == 1
            assert (await counting(iter([echo] * 3), timeout=5)).nonce == 3
        finally:
            await pool.close_all()
            await server.stop(None)

    asyncio.run(main())
