"""The data-plane sender of a stage worker: a microbatch's activation to a next-stage node picked
by the flows, its gradient back up its path, and a replacement's request for that gradient
(`ask_redirect`), each with retries and backoff (docs/design.md 2.8, 3.7 and 4).

Every send is on the iteration's record (the ledger, and the tensors in `Iteration.kept`) before
it leaves, so a receiver that dies mid-call is still on the record and the recovery of its death
resends the kept tensors. A send gives up once the iteration (or its round) moves on, or once the
job fails.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping

import grpc
from grpc import aio
from torch import Tensor

from gwtf.job.nexthop import SmoothRoundRobin, live_weights
from gwtf.job.swarmroute import SwarmBalancer
from gwtf.node.dataplane.tensors import MicrobatchTag, TensorError, send
from gwtf.node.observe import job_event
from gwtf.node.rpc.retry import is_final
from gwtf.node.rpc.transport import is_refused
from gwtf.node.worker.stage import Iteration, StageContext
from gwtf.recovery import Mode, Rule
from gwtf.train.codecs import pack
from gwtf.v1 import job_pb2

__all__ = ["DataPlaneSender"]

# Outcomes of one send attempt.
_SENT, _BUSY, _RETRY, _GIVE_UP = range(4)
# Sends refused by a node that no longer takes part in the job, before this node has heard that
# it left or was excluded: with the backoff, several seconds for the news to arrive.
_UNHEARD_ATTEMPTS = 8
ENCODE_INLINE_BYTES = 1 << 20
"""Tensors up to this size are encoded on the event loop (well under a millisecond); larger ones
in a thread, so that the node keeps answering its peers meanwhile."""


def _nbytes(tensors: Mapping[str, Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


SWARM_BAN_S = 30.0
"""With SWARM's routing, how long a peer whose call failed is left out: SWARM keeps the ban
until the peer's DHT record expires, which its servers renew every 30 s (`update_period`)."""


class DataPlaneSender:
    """Sends of the stage's microbatches, and their counts."""

    def __init__(self, ctx: StageContext) -> None:
        self._ctx = ctx
        self._rr = SmoothRoundRobin(owner=ctx.host.node_id)
        self.route_sources: dict[str, int] = {}
        """How many next hops came from the flows and how many from capacities."""
        self.rerouted = 0
        """Microbatches this node resent to a replacement (rules 1-3)."""
        self.live_pace: dict[str, float] = {}
        """The seconds per microbatch each next hop said in its last acknowledgement: a share
        cut for a straggler until the flows move (gwtf.job.nexthop.live_weights)."""
        spec = ctx.executor.spec
        self.codecs = {
            "forward": ctx.job.compression.codec_after(spec.end_layer),
            "backward": ctx.job.compression.codec_after(spec.first_layer),
        }
        """The codec of what this stage sends each way: its activations cross the boundary
        below it, its input gradients the one above (the job's plan, docs/design.md 2.15)."""
        self._swarm: SwarmBalancer | None = None
        if ctx.host.routing() == "swarm":
            # Seeded by the node and the job: a run's choices depend on what it measures only.
            self._swarm = SwarmBalancer(random.Random(f"{ctx.host.node_id}/{ctx.job_id}"))

    async def _wire(self, direction: str, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        """What goes on the wire of `tensors`: the microbatch's activation or gradient through
        its boundary's codec (encoded off the event loop when large), the labels as they are."""
        name = self.codecs[direction]
        if name == "none":
            return tensors
        field = "activation" if direction == "forward" else "gradient"
        value = tensors[field]
        if value.numel() * value.element_size() > ENCODE_INLINE_BYTES:
            parts = await asyncio.to_thread(pack, name, field, value)
        else:
            parts = pack(name, field, value)
        return {**{k: v for k, v in tensors.items() if k != field}, **parts}

    def count_data(self, verb: str, direction: str, tensors: Mapping[str, Tensor]) -> None:
        """A microbatch `verb` (sent, received) on the data plane, and its payload bytes."""
        ctx = self._ctx
        nbytes = _nbytes(tensors)
        ctx.metrics.count(f"gwtf_job_microbatches_{verb}", ctx.job_id, direction)
        ctx.metrics.count(f"gwtf_job_bytes_{verb}", ctx.job_id, direction, nbytes)
        if verb == "sent":
            ctx.it.sent_bytes += nbytes

    def _weights(self, exclude: str = "") -> tuple[dict[str, int], str]:
        """The live next-stage participants' weights (but `exclude`'s), and their source."""
        ctx = self._ctx
        capacities: dict[str, float] = {}
        solved: dict[str, float] = {}
        for peer, stage in ctx.participants.items():
            if stage != ctx.stage + 1 or peer == exclude or peer in ctx.departed:
                continue
            member = ctx.host.member(peer)
            if member is not None:
                capacities[peer] = member.capacity
                solved[peer] = member.compute_s
        weights, source = ctx.host.next_hop_weights(capacities)
        return live_weights(weights, solved, self.live_pace), source

    def _pick(self, dead: str, excluded: set[str]) -> tuple[str | None, str]:
        """The next hop for one forward (never `dead`, `excluded` only if nothing else is
        left), and where the choice came from: the flows, the capacities, or "swarm"."""
        weights, source = self._weights(exclude=dead)
        balancer = self._swarm
        if balancer is None:
            return self._rr.pick(weights, excluded) or self._rr.pick(weights), source
        # SWARM's routing: the same candidates, chosen by this sender's throughput estimates.
        now = time.monotonic()
        for peer in [p for p in balancer.runtime if p not in weights]:
            balancer.forget(peer)
        for peer in sorted(weights):
            balancer.add(peer, now)
        if not balancer.runtime:
            # Every live candidate is banned: SWARM refreshes its peers when none is left, and
            # the membership says these are alive, so their bans are lifted.
            for peer in sorted(weights):
                balancer.unban(peer)
                balancer.add(peer, now)
        return balancer.choose(excluded) or balancer.choose(), "swarm"

    async def send_forward(
        self,
        it: Iteration,
        m: int,
        tensors: dict[str, Tensor],
        *,
        mode: Mode = Mode.FORWARD,
        dead: str = "",
        downstream: str = "",
    ) -> None:
        """Send `m`'s activation to a next-stage node picked by the flows (for a recovery, with
        `mode`, never to `dead`). The send is on the record before it leaves; a receiver that
        dies with it is left to the recovery of its death (the record is the evidence)."""
        ctx = self._ctx
        excluded: set[str] = set()
        attempt = 0
        waited = False
        # A live node whose call failed may have taken the activation all the same (the answer
        # was lost with a connection or a relay that died, docs/design.md 3.11): it is sent there
        # again, where a second copy is recognised, rather than to another node of the stage,
        # whose gradient would then meet one from the first. For up to the failure detector's
        # time: a node that stays out of reach longer is dead, or its arc blocked.
        sticky, sticky_until, source = "", 0.0, ""
        while ctx.current(it):
            target: str | None
            if sticky and ctx.peer(sticky) is not None and time.monotonic() < sticky_until:
                target = sticky  # counted under what chose it first
            else:
                target, source = self._pick(dead, excluded)
            if target is None:
                if mode != Mode.FORWARD and not waited:
                    ctx.host.log.warning(
                        "job %s it %d mb %d: stage %d has no live node; the recovery waits for "
                        "one to join (rule 5)", ctx.job_id, it.number, m, ctx.stage + 1,
                        extra=job_event(ctx.job_id, it.number, m),
                    )
                    waited = True
                await asyncio.sleep(ctx.backoff(attempt))
                attempt += 1
                continue
            self.route_sources[source] = self.route_sources.get(source, 0) + 1
            ctx.ledger.activation_sent(m, target, mode)
            started = time.monotonic()
            outcome = await self._send(
                it, m, "forward", target, tensors, attempt, mode=mode, downstream=downstream,
                recovered_from=dead,
            )
            if self._swarm is not None:
                self._swarm_outcome(target, outcome, started)
            if outcome == _SENT:
                if mode != Mode.FORWARD or dead:
                    self.rerouted += 1
                    rule = Rule(int(mode) + 1 if mode else 1).name
                    ctx.metrics.count("gwtf_job_reroutes", ctx.job_id, rule.lower())
                    ctx.host.log.info(
                        "job %s it %d mb %d: rerouted from dead %s to %s (%s)", ctx.job_id,
                        it.number, m, dead, target, rule,
                        extra=job_event(ctx.job_id, it.number, m),
                    )
                return
            if outcome == _GIVE_UP or ctx.ledger.activation_receiver(m) != target:
                return
            if outcome == _BUSY:
                excluded.add(target)  # it did not take it: another node may
            elif ctx.peer(target) is None:
                return  # it died with the microbatch: the recovery of its death resends it
            elif not sticky:
                sticky = target
                sticky_until = time.monotonic() + ctx.config.failure_timeout_s
            attempt += 1

    def _swarm_outcome(self, target: str, outcome: int, started: float) -> None:
        """What SWARM's chooser learns from one forward to `target` (gwtf.job.swarmroute): a
        call that ends at the acknowledgement plus the compute the receiver tells in it, or a
        failure, which bans the peer."""
        balancer = self._swarm
        assert balancer is not None
        now = time.monotonic()
        if outcome == _SENT:
            balancer.measured(target, started, now + self.live_pace.get(target, 0.0))
        elif outcome == _RETRY:
            balancer.ban(target, now + SWARM_BAN_S)

    async def send_backward(self, it: Iteration, m: int, gradient: Tensor) -> None:
        """Send `m`'s input gradient to the node of the stage above on its path; a redirect
        changes that node while this runs. Kept for a resend until the iteration steps."""
        ctx = self._ctx
        key = (m, "backward")
        target = it.paths[m][ctx.stage - 1]
        it.kept[key] = (target, {"gradient": gradient})
        if key in it.sending:
            return
        it.sending.add(key)
        try:
            attempt = 0
            while ctx.current(it):
                target = it.paths[m][ctx.stage - 1]
                ctx.ledger.gradient_sent(m, target)
                outcome = await self._send(
                    it, m, "backward", target, {"gradient": gradient}, attempt
                )
                if outcome == _GIVE_UP:
                    return
                if outcome == _SENT and it.paths[m][ctx.stage - 1] == target:
                    return
                if outcome != _SENT and ctx.peer(target) is None and (
                    it.paths[m][ctx.stage - 1] == target
                ):
                    return  # dead: a recovery will redirect this gradient (it is kept)
                attempt += 1
        finally:
            it.sending.discard(key)

    async def _send(
        self,
        it: Iteration,
        m: int,
        direction: str,
        target: str,
        tensors: dict[str, Tensor],
        attempt: int,
        *,
        mode: Mode = Mode.FORWARD,
        downstream: str = "",
        recovered_from: str = "",
    ) -> int:
        """One attempt: _SENT once `target` took the microbatch, _BUSY when it refused it for
        now, _RETRY on a failed call, _GIVE_UP when the job failed or the iteration moved on."""
        ctx = self._ctx
        if attempt:
            await asyncio.sleep(ctx.backoff(attempt - 1))
        if not ctx.current(it):
            return _GIVE_UP
        member = ctx.peer(target)
        if member is None:
            return _RETRY
        tag = MicrobatchTag(
            job_id=ctx.job_id,
            iteration=it.number,
            microbatch=m,
            direction=direction,
            sender=ctx.host.node_id,
            # Forward: the path up to this node (a resend after the gradient came back knows
            # the whole path); backward: all of it.
            path=it.paths[m][: ctx.stage + 1] if direction == "forward" else it.paths[m],
            attempt=attempt,
            mode=int(mode),
            round=it.round,
            downstream=downstream,
            recovered_from=recovered_from,
        )
        it.kept[(m, direction)] = (target, tensors)

        async def wan(nbytes: int) -> None:
            delay = ctx.host.wan_delay(member, nbytes)
            if ctx.fault is not None:
                delay *= ctx.fault.slowdown("link", it.number, target)
            if delay > 0:
                await asyncio.sleep(delay)

        wire = await self._wire(direction, tensors)
        try:
            pace_s = await send(
                ctx.host.data_stub(member), tag, wire,
                timeout=ctx.config.data_timeout_s, delay=wan,
            )
        except aio.AioRpcError as err:
            if not ctx.current(it):
                return _GIVE_UP
            if is_final(err):
                if "is over here" in (err.details() or ""):
                    return _GIVE_UP  # the receiver moved on (a restart): so will this node
                if "does not take part" in (err.details() or "") and (
                    target in ctx.departed or attempt < _UNHEARD_ATTEMPTS
                ):
                    # The receiver stopped its part: it was excluded or it left, and that news
                    # reaches every node a moment later. Until then the tensors are kept and
                    # sent again; once it is heard, the recovery of that departure redirects
                    # them (the same as for a death). Refused on and on, unheard of, it fails.
                    ctx.host.log.info(
                        "job %s it %d mb %d: %s no longer takes part in the job; the %s is "
                        "kept for its recovery", ctx.job_id, it.number, m, target, direction,
                        extra=job_event(ctx.job_id, it.number, m),
                    )
                    return _RETRY
                ctx.fail(f"{target} refused microbatch {m} of iteration {it.number}: "
                         f"{err.details()}")
                return _GIVE_UP
            ctx.host.log.warning(
                "job %s it %d mb %d: %s to %s failed (%s), attempt %d",
                ctx.job_id, it.number, m, direction, target, err.code().name, attempt + 1,
                extra=job_event(ctx.job_id, it.number, m),
            )
            if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                return _BUSY
            if is_refused(err):
                ctx.host.refused(member)
            return _RETRY
        except TensorError as err:
            ctx.fail(f"microbatch {m} of iteration {it.number} could not be sent: {err}")
            return _GIVE_UP
        if direction == "forward" and pace_s > 0:
            self.live_pace[target] = pace_s
        self.count_data("sent", direction, wire)
        if wire is not tensors:
            ctx.metrics.count("gwtf_job_bytes_saved", ctx.job_id, direction,
                              _nbytes(tensors) - _nbytes(wire))
        return _SENT

    async def ask_redirect(self, it: Iteration, m: int, downstream: str, mode: Mode) -> None:
        """Ask `downstream` to send `m`'s gradient here (again, if the dead node had it)."""
        ctx = self._ctx
        request = job_pb2.RedirectRequest(
            sender=ctx.host.node_id, job_id=ctx.job_id, iteration=it.number, round=it.round,
            microbatch=m, stage=ctx.stage, mode=int(mode),
        )
        attempt = 0
        while ctx.current(it):
            member = ctx.peer(downstream)
            if member is None:
                return  # it died too: its own recovery takes the microbatch from here
            try:
                await ctx.host.job_stub(member).Redirect(
                    request, timeout=ctx.config.rpc_timeout_s
                )
                return
            except aio.AioRpcError as err:
                if is_final(err):
                    ctx.host.log.warning(
                        "job %s it %d mb %d: %s refused the redirect: %s", ctx.job_id,
                        it.number, m, downstream, err.details(),
                        extra=job_event(ctx.job_id, it.number, m),
                    )
                    return
            await asyncio.sleep(ctx.backoff(attempt))
            attempt += 1
