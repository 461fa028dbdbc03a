"""Measured links as gossiped records (docs/design.md 2.12): what a node reports, and the links
every node solves with. Pure and deterministic.

A node's record carries, next to its id, stage and site, a short list of `LinkReport`s (the
link from its site to another site, as its probes measured it) and the ids of the next-stage
members it cannot reach (blocked arcs). Values travel as integer *levels* on a logarithmic grid
of `STEPS_PER_OCTAVE` steps per factor of 2 (19% apart): a level is exact on the wire, so every
node reads the same numbers, and probe noise inside one step changes nothing.

A node reports a site's RTT, and its bandwidth, each only when it differs materially from the
link the routing would take without the report (`material`: the arc's cost by more than
`cost_rel`, or its capacity by more than the factor `1 + cap_rel` where the capacity can bind),
so on a swarm whose links are what the matrix says, records carry no report at all. A report
changes only when the measurement moves materially from the reported value, so records change
rarely.

`site_links` turns the live records into the links of the solve: per pair of distinct sites,
the median (the lower one of an even count, so the result is a level again) of every report
about the pair from either end, RTT and bandwidth apart; where no one reported one, the base
matrix's link, or `default` (the intra-location link on a swarm with no matrix, where every
site pair is joined). Links inside one site are never re-rated: the solver has one intra link.
`blocked_arcs` turns the blocked lists into arcs between live members.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from gwtf.flow.topology import LinkSpec, cap_to_units, cost_to_units

__all__ = [
    "MAX_BLOCKED",
    "MAX_REPORTS",
    "STEPS_PER_OCTAVE",
    "LinkReport",
    "LinkReportError",
    "SiteLinks",
    "SiteRecord",
    "blocked_arcs",
    "check_record",
    "level",
    "material",
    "report",
    "site_links",
    "site_of",
    "solve_sites",
    "unlevel",
]

STEPS_PER_OCTAVE = 4
"""Grid of the levels: 2^(1/4), 19% apart. Coarser than the 50% cost hysteresis would make a
report jump by whole steps; finer would let noise flip a level at a step's edge more often."""

RTT_LEVELS = (-40, 68)
"""RTT levels accepted, ms: 2^-10 (1 us) to 2^17 (131 s)."""

BANDWIDTH_LEVELS = (-60, 60)
"""Bandwidth levels accepted, Gbit/s: 2^-15 (30 kbit/s) to 2^15 (32 Tbit/s)."""

MAX_REPORTS = 64
"""Most reports in one record: a node probes its next hops and a few explored peers, so it
reports on a handful of sites; the bound keeps a record small whatever a peer sends."""

MAX_BLOCKED = 64
"""Most blocked heads in one record."""


def site_of(node_id: str, location: str) -> str:
    """A node's site: its location, or, with none, the node itself (`@` and its id), so that
    what its probes measure can re-rate its links alone."""
    return location or f"@{node_id}"


def solve_sites(
    members: Iterable[tuple[str, str, tuple[LinkReport, ...]]], shared: str
) -> dict[str, str]:
    """Each member's site in the solve, from its (id, location, reports): its location; for a
    member without one, its own site (`site_of`) when it reports a link or a report names it,
    else the site `shared` by all the others. Every site pair no one measured is the same
    default link, so the unmeasured nodes lose nothing by sharing one site, and the solve's cells
    stay few: a site per node made its hub arcs grow as N^2."""
    members = list(members)
    named = {r.site for _, _, reports in members for r in reports}
    return {
        node_id: location
        or (site_of(node_id, "") if reports or site_of(node_id, "") in named else shared)
        for node_id, location, reports in members
    }


class LinkReportError(ValueError):
    """A record's link reports are malformed; the message says what."""


def level(value: float, bounds: tuple[int, int]) -> int:
    """The grid level nearest to a positive `value`, clamped to `bounds`."""
    if not (math.isfinite(value) and value > 0):
        raise LinkReportError(f"a measured link value must be positive and finite, got {value!r}")
    raw = round(STEPS_PER_OCTAVE * math.log2(value))
    return min(max(raw, bounds[0]), bounds[1])


def unlevel(lvl: int) -> float:
    return float(2.0 ** (lvl / STEPS_PER_OCTAVE))


@dataclass(frozen=True, slots=True, order=True)
class LinkReport:
    """The link from the reporter's site to `site`: RTT level (ms) and bandwidth level
    (Gbit/s); None where the measurement is not reported (it did not differ materially), and
    the base link's value is kept."""

    site: str
    rtt_level: int | None
    bandwidth_level: int | None = None

    @property
    def rtt_ms(self) -> float | None:
        return None if self.rtt_level is None else unlevel(self.rtt_level)

    @property
    def bandwidth_gbps(self) -> float | None:
        return None if self.bandwidth_level is None else unlevel(self.bandwidth_level)


def report(site: str, rtt_ms: float | None, bandwidth_gbps: float | None) -> LinkReport:
    """A report of a measured link, on the grid."""
    rtt = None if rtt_ms is None else level(rtt_ms, RTT_LEVELS)
    bw = None if bandwidth_gbps is None else level(bandwidth_gbps, BANDWIDTH_LEVELS)
    return LinkReport(site, rtt, bw)


def check_record(
    owner: str, site: str, reports: Iterable[LinkReport], blocked: Iterable[str]
) -> None:
    """Raise LinkReportError, saying what, if a peer's record is malformed: too many entries,
    a level off the grid's range, a site reported twice or about itself, a head blocked twice
    or the owner blocking itself."""
    reports, blocked = list(reports), list(blocked)
    if len(reports) > MAX_REPORTS:
        raise LinkReportError(f"member {owner!r} reports {len(reports)} links, more than "
                              f"{MAX_REPORTS}")  # fmt: skip
    if len(blocked) > MAX_BLOCKED:
        raise LinkReportError(f"member {owner!r} blocks {len(blocked)} arcs, more than "
                              f"{MAX_BLOCKED}")  # fmt: skip
    seen: set[str] = set()
    for r in reports:
        if r.site == site:
            raise LinkReportError(f"member {owner!r} reports a link to its own site {site!r}")
        if r.site in seen:
            raise LinkReportError(f"member {owner!r} reports site {r.site!r} twice")
        seen.add(r.site)
        if r.rtt_level is None and r.bandwidth_level is None:
            raise LinkReportError(f"member {owner!r} reports nothing about {r.site!r}")
        if r.rtt_level is not None and not RTT_LEVELS[0] <= r.rtt_level <= RTT_LEVELS[1]:
            raise LinkReportError(
                f"member {owner!r} reports an RTT level {r.rtt_level} to {r.site!r}, outside "
                f"{RTT_LEVELS[0]}..{RTT_LEVELS[1]}"
            )
        b = r.bandwidth_level
        if b is not None and not BANDWIDTH_LEVELS[0] <= b <= BANDWIDTH_LEVELS[1]:
            raise LinkReportError(
                f"member {owner!r} reports a bandwidth level {b} to {r.site!r}, outside "
                f"{BANDWIDTH_LEVELS[0]}..{BANDWIDTH_LEVELS[1]}"
            )
    if owner in blocked:
        raise LinkReportError(f"member {owner!r} blocks an arc to itself")
    if len(set(blocked)) != len(blocked):
        raise LinkReportError(f"member {owner!r} blocks the same head twice")


def material(
    base: LinkSpec,
    measured: LinkSpec,
    *,
    tail: tuple[float, float],
    head: tuple[float, float],
    activation_bytes: int,
    cost_rel: float,
    cap_rel: float,
) -> bool:
    """Whether routing by `measured` instead of `base` changes the arc between a tail and a
    head of (compute_s, capacity) `tail` and `head` materially: its cost (docs/design.md 2.1)
    by more than the fraction `cost_rel`, or its capacity by more than the factor `1 + cap_rel`
    where the lower of the two capacities can bind (below either node's: a node pair never
    carries more than its ends, so a loopback's noisy gigabits do not count)."""
    act = activation_bytes

    def arc(link: LinkSpec) -> tuple[int, int]:
        cost = (tail[0] + head[0]) / 2 + link.rtt_ms / 2000 + act * 8 / (link.bandwidth_gbps * 1e9)
        return cost_to_units(cost), cap_to_units(link.bandwidth_gbps * 1e9 / 8 / act)

    (old_cost, old_cap), (new_cost, new_cap) = arc(base), arc(measured)
    if abs(new_cost - old_cost) > cost_rel * max(old_cost, 1):
        return True
    low, high = sorted((max(old_cap, 1), max(new_cap, 1)))
    return low < min(cap_to_units(tail[1]), cap_to_units(head[1])) and high > (1 + cap_rel) * low


@dataclass(frozen=True, slots=True)
class SiteRecord:
    """What the solve needs of one live member's record: its id, site, reports, blocked."""

    id: str
    site: str
    reports: tuple[LinkReport, ...] = ()
    blocked: tuple[str, ...] = ()


class SiteLinks(Mapping[frozenset[str], LinkSpec]):
    """The links of a solve: the measured ones over the base matrix, then `default` for any
    other pair of distinct sites. Only `measured` and the base are iterated; `get` answers
    every pair (what gwtf.flow.localsolve asks)."""

    def __init__(
        self,
        measured: Mapping[frozenset[str], LinkSpec],
        base: Mapping[frozenset[str], LinkSpec],
        default: LinkSpec | None,
    ) -> None:
        self.measured = dict(sorted(measured.items(), key=lambda kv: sorted(kv[0])))
        self._base = base
        self._default = default

    def __getitem__(self, key: frozenset[str]) -> LinkSpec:
        link = self.measured.get(key) or self._base.get(key)
        if link is None and self._default is not None and len(key) == 2:
            link = self._default
        if link is None:
            raise KeyError(key)
        return link

    def __iter__(self) -> Iterator[frozenset[str]]:
        return iter({**self._base, **self.measured})

    def __len__(self) -> int:
        return len({**self._base, **self.measured})

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, frozenset):
            return False
        try:
            self[key]
        except KeyError:
            return False
        return True

    def key(self) -> tuple[tuple[tuple[str, ...], LinkSpec], ...]:
        """The measured links, comparable: two solves with equal keys (and base) are equal."""
        return tuple((tuple(sorted(pair)), link) for pair, link in self.measured.items())


def site_links(
    records: Iterable[SiteRecord],
    base: Mapping[frozenset[str], LinkSpec],
    default: LinkSpec | None,
) -> SiteLinks:
    """The links every node with these records solves with (module doc). Only pairs of sites
    that both hold a record count, and only pairs the base or the default joins."""
    records = list(records)
    sites = {r.site for r in records}
    rtts: dict[frozenset[str], list[int]] = {}
    bws: dict[frozenset[str], list[int]] = {}
    for rec in records:
        for r in rec.reports:
            if r.site == rec.site or r.site not in sites:
                continue
            pair = frozenset((rec.site, r.site))
            if r.rtt_level is not None:
                rtts.setdefault(pair, []).append(r.rtt_level)
            if r.bandwidth_level is not None:
                bws.setdefault(pair, []).append(r.bandwidth_level)
    measured: dict[frozenset[str], LinkSpec] = {}
    for pair in sorted({*rtts, *bws}, key=sorted):
        fallback = base.get(pair) or default
        if fallback is None:
            continue  # the sites are not joined: a report does not create a link
        rtt, bw = rtts.get(pair), bws.get(pair)
        measured[pair] = LinkSpec(
            unlevel(statistics.median_low(rtt)) if rtt else fallback.rtt_ms,
            unlevel(statistics.median_low(bw)) if bw else fallback.bandwidth_gbps,
        )
    return SiteLinks(measured, base, default)


def blocked_arcs(records: Iterable[SiteRecord]) -> frozenset[tuple[str, str]]:
    """Every (tail, head) a live member blocks, to a head that is a live member too."""
    records = list(records)
    live = {r.id for r in records}
    return frozenset((r.id, head) for r in records for head in r.blocked if head in live)
