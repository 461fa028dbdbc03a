"""The live terminal view of a swarm (`gwtf status --watch`), drawn with rich.

`SwarmWatch` keeps the previous snapshot of `gwtf status --json` and turns each new one into a
screen: members per stage (alive ones, with capacity and flow through them), the flows between
stages, the flow value, and a log of what changed between snapshots (deaths, leaves, joins,
reconvergence), which is how an operator sees a crash and its recovery as they happen. Extra
panels (a job's progress) can be added by whoever drives it.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = ["SwarmWatch", "watch"]

EVENTS_SHOWN = 12


class SwarmWatch:
    """Successive swarm views in, a rich renderable out."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start = clock()
        self._previous: dict[str, Any] | None = None
        self.events: deque[str] = deque(maxlen=EVENTS_SHOWN)
        self.error: str | None = None

    def update(self, view: dict[str, Any]) -> list[str]:
        """Take a new view; return the events it shows since the previous one."""
        self.error = None
        t = self._clock() - self._start
        new: list[str] = []
        before = self._previous
        if before is not None:
            was = {m["id"]: m for m in before["members"]}
            now = {m["id"]: m for m in view["members"]}
            for node, m in sorted(now.items()):
                old = was.get(node)
                if m["alive"] and (old is None or not old["alive"] or old["epoch"] != m["epoch"]):
                    new.append(f"{t:7.1f} s  {node} joined stage {m['stage']}")
                elif not m["alive"] and old is not None and old["alive"]:
                    verb = "left" if m["state"] == "left" else "died (declared dead)"
                    new.append(f"{t:7.1f} s  {node} {verb}")
            if view["converged"] and not before["converged"]:
                new.append(f"{t:7.1f} s  flows reconverged: {view['flow_value']:.3f} mb/s")
            elif before["converged"] and not view["converged"]:
                new.append(f"{t:7.1f} s  flows rerouting")
        else:
            new.append(f"{t:7.1f} s  watching swarm {view['swarm']['id']} via {view['node']}")
        self.events.extend(new)
        self._previous = view
        return new

    def failed(self, message: str) -> None:
        self.error = message

    def elapsed(self) -> float:
        """Seconds since the watch began (the time its event lines carry)."""
        return self._clock() - self._start

    def render(self) -> Any:
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        view = self._previous
        parts: list[Any] = []
        if view is None:
            parts.append(Text(self.error or "waiting for the first status ..."))
            return Group(*parts)
        alive = [m for m in view["members"] if m["alive"]]
        state = "[green]converged[/]" if view["converged"] else "[yellow]rerouting[/]"
        head = (
            f"swarm [bold]{view['swarm']['id']}[/] via {view['node']}: "
            f"{len(alive)} live members in {view['swarm']['num_stages']} stages, "
            f"flow value [bold]{view['flow_value']:.3f}[/] microbatches/s, {state}"
        )
        if self.error:
            head += f"\n[red]{self.error}[/]"
        parts.append(Text.from_markup(head))
        through = {n["id"]: n["throughput"] for n in view["nodes"]}
        stages = Table(title="members per stage", expand=True)
        stages.add_column("stage", justify="right")
        stages.add_column("nodes (capacity / routed, microbatches/s)")
        for stage in range(view["swarm"]["num_stages"]):
            here = sorted((m for m in alive if m["stage"] == stage), key=lambda m: m["id"])
            cells = [f"{m['id']} {m['capacity']:.2f}/{through.get(m['id'], 0.0):.2f}"
                     for m in here]  # fmt: skip
            stages.add_row(str(stage), ", ".join(cells) or "[red]empty[/]")
        parts.append(stages)
        flows = Table(title="flows", expand=True)
        for name, justify in (("arc", "left"), ("mb/s", "right"), ("rtt ms", "right"),
                              ("Gbit/s", "right")):  # fmt: skip
            flows.add_column(name, justify=justify)  # type: ignore[arg-type]
        for arc in view["arcs"]:
            if arc["flow"] > 0:
                flows.add_row(f"{arc['src']} -> {arc['dst']}", f"{arc['flow']:.3f}",
                              f"{arc['rtt_ms']:.1f}", f"{arc['bandwidth_gbps']:.2f}")  # fmt: skip
        parts.append(flows)
        parts.append(Panel("\n".join(self.events) or "-", title="events"))
        return Group(*parts)


class _Interrupts:
    """Ctrl-C, seen even where a fetch swallows it.

    A fetch runs a gRPC call under `asyncio.run`, whose own SIGINT handler cancels the call;
    grpc's asyncio stub then ends it as an RPC error (CANCELLED), which a watch that goes on
    through fetch errors took for a node down for a moment: the Ctrl-C was lost, and the watch
    ran on (a test that interrupted it under load waited for it in vain). While this handler is
    installed asyncio leaves SIGINT alone; it raises KeyboardInterrupt as the default one does
    and remembers it, and the loop checks `seen` after every fetch."""

    def __init__(self) -> None:
        self.seen = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.seen = True
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self) -> Iterator[_Interrupts]:
        try:
            previous = signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main thread: nothing to install
            yield self
            return
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)


def watch(
    fetch: Callable[[], dict[str, Any]],
    interval_s: float,
    *,
    errors: tuple[type[Exception], ...],
    screen: bool = True,
) -> int:
    """Refresh the view every `interval_s` until Ctrl-C; `fetch` returns a view or raises one
    of `errors`, whose message is shown (the node may be down for a moment). Into a pipe or a
    file, where a redrawn screen shows nothing, it writes the events as lines instead."""
    from rich.console import Console
    from rich.live import Live

    state = SwarmWatch()
    console = Console()
    with _Interrupts().installed() as interrupts:
        if not console.is_terminal:
            return _log(state, fetch, interval_s, errors, interrupts)
        try:
            with Live(state.render(), console=console, screen=screen,
                      auto_refresh=False) as live:
                while not interrupts.seen:
                    try:
                        state.update(fetch())
                    except errors as err:  # shown in the view; the watch goes on
                        state.failed(str(err))
                    live.update(state.render(), refresh=True)
                    time.sleep(interval_s)
        except KeyboardInterrupt:
            pass
        return 0


def _log(
    state: SwarmWatch, fetch: Callable[[], dict[str, Any]], interval_s: float,
    errors: tuple[type[Exception], ...], interrupts: _Interrupts,
) -> int:
    """The watch as a log: each event a line, and each failure to fetch when it changes."""
    import os
    import sys

    shown_error: str | None = None
    try:
        while not interrupts.seen:
            try:
                lines = state.update(fetch())
                shown_error = None
            except errors as err:
                if interrupts.seen:
                    break
                lines = []
                if str(err) != shown_error:
                    shown_error = str(err)
                    lines.append(f"{state.elapsed():7.1f} s  {err}")
            for line in lines:
                print(line, flush=True)
            time.sleep(interval_s)
        return 0
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `gwtf status --watch | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
