"""Machines with their own network stacks on one Linux host, for benchmarks that need real
links: one network namespace per machine, joined by veth pairs to a bridge, each machine's
uplink shaped by the kernel (`tc` tbf on its end of the pair: everything it sends shares it).
Delays are not shaped (this kernel has no netem): a benchmark that wants them uses the emulated
WAN. Needs root and `ip`, `tc`; addresses are private (10.77.0.0/24 by default), traffic never
leaves the host. Each `Hosts` takes its own tag, bridge and subnet, so that two can exist at
once (a benchmark and a test).

    with Hosts(["h0", "h1"], uplink_mbps={"h0": 4, "h1": 8}) as hosts:
        hosts.address("h0")                    # "10.77.0.2"
        hosts.popen("h0", [sys.executable, ...])   # a process inside h0's namespace
        hosts.exec_prefix("h0")                # ["ip", "netns", "exec", ...] for other launchers

Hosts named in `behind_nat` sit on a home LAN of their own (192.168.77.0/24 by default) behind
a router namespace that masquerades their connections out to the bridge and lets none in, as a
home router or a carrier-grade NAT does: they can dial every public host, and no host can dial
them (`nat_address` is what public hosts see their connections come from). Needs `iptables`.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

__all__ = ["Hosts", "HostsError", "available"]

PREFIX = "10.77.0"
LAN_PREFIX = "192.168.77"
BURST = "32kb"
"""tbf's bucket: a few packets, so that the rate holds over tens of milliseconds."""
QUEUE_LATENCY = "2s"
"""The longest a packet may wait in the uplink's queue before tbf drops it: long, as a home
router's buffer is (bufferbloat), so that TCP rarely loses a packet to it."""


class HostsError(RuntimeError):
    """The namespaces could not be made (not root, no `ip`): the message says which command."""


def available() -> str:
    """"" when namespaces can be made here, else why not (one sentence)."""
    for tool in ("ip", "tc", "iptables"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2, iptables)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` fails here: {probe.stderr.strip() or 'not root?'}"
    return ""


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise HostsError(f"{' '.join(argv)}: {done.stderr.strip()}")


class Hosts:
    """One namespace per name, on one bridge, each uplink shaped to `uplink_mbps[name]` (not
    shaped where absent). Made on entry, removed on exit (with every process still inside)."""

    def __init__(self, names: Sequence[str], uplink_mbps: Mapping[str, float] | None = None,
                 tag: str = "gwtfb", prefix: str = PREFIX, behind_nat: Sequence[str] = (),
                 lan_prefix: str = LAN_PREFIX) -> None:  # fmt: skip
        if len(names) > 250:
            raise HostsError("at most 250 hosts on one bridge")
        if not 1 <= len(tag) <= 8:
            raise HostsError("a tag has 1 to 8 characters (interface names have at most 15)")
        self.names = list(names)
        self.uplink_mbps = dict(uplink_mbps or {})
        self.tag = tag
        self.prefix = prefix
        self.bridge = f"{tag}br0"
        self.bridge_address = f"{prefix}.1"
        """The host's own address on the bridge: a client outside the namespaces dials from it."""
        self.behind_nat = [n for n in names if n in set(behind_nat)]
        self.lan_prefix = lan_prefix
        self.lan = f"{tag}br1"
        self.nat_address = f"{prefix}.254"
        """Where the NATed hosts' connections come from, as public hosts see them."""
        self._procs: list[subprocess.Popen[Any]] = []

    def namespace(self, name: str) -> str:
        return f"{self.tag}-{self.names.index(name)}"

    def address(self, name: str) -> str:
        prefix = self.lan_prefix if name in self.behind_nat else self.prefix
        return f"{prefix}.{self.names.index(name) + 2}"

    def exec_prefix(self, name: str) -> list[str]:
        """The command line that runs what follows it inside `name`'s namespace."""
        return ["ip", "netns", "exec", self.namespace(name)]

    def _veth(self, name: str) -> tuple[str, str]:
        i = self.names.index(name)
        return f"{self.tag}v{i}", f"{self.tag}v{i}p"

    def __enter__(self) -> Hosts:
        self.close()  # what a killed earlier run left
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            if self.behind_nat:
                self._router()
            for name in self.names:
                ns = self.namespace(name)
                outer, inner = self._veth(name)
                _run("ip", "netns", "add", ns)
                _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
                _run("ip", "link", "set", inner, "netns", ns)
                lan = name in self.behind_nat
                _run("ip", "link", "set", outer, "master", self.lan if lan else self.bridge)
                _run("ip", "link", "set", outer, "up")
                _run("ip", "netns", "exec", ns, "ip", "addr", "add",
                     f"{self.address(name)}/24", "dev", inner)  # fmt: skip
                _run("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
                _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
                if lan:
                    _run("ip", "netns", "exec", ns, "ip", "route", "add", "default", "via",
                         f"{self.lan_prefix}.1")  # fmt: skip
                mbps = self.uplink_mbps.get(name)
                if mbps:
                    _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", inner, "root",
                         "tbf", "rate", f"{mbps}mbit", "burst", BURST,
                         "latency", QUEUE_LATENCY)  # fmt: skip
        except BaseException:
            self.close()
            raise
        return self

    def _router(self) -> None:
        """The NAT: a namespace with one leg on the bridge and one on the home LAN, forwarding
        and masquerading what goes out, dropping new connections coming in."""
        ns, tag = f"{self.tag}-nat", self.tag
        _run("ip", "link", "add", self.lan, "type", "bridge")
        _run("ip", "link", "set", self.lan, "up")
        _run("ip", "netns", "add", ns)
        for leg, bridge, address in (("np", self.bridge, f"{self.nat_address}/24"),
                                     ("nl", self.lan, f"{self.lan_prefix}.1/24")):
            inner, outer = f"{tag}{leg}", f"{tag}{leg}o"
            _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            _run("ip", "link", "set", inner, "netns", ns)
            _run("ip", "link", "set", outer, "master", bridge)
            _run("ip", "link", "set", outer, "up")
            _run("ip", "netns", "exec", ns, "ip", "addr", "add", address, "dev", inner)
            _run("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
        public, home = f"{tag}np", f"{tag}nl"
        inside = ["ip", "netns", "exec", ns]
        _run(*inside, "ip", "link", "set", "lo", "up")
        _run(*inside, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        _run(*inside, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", public, "-j",
             "MASQUERADE")  # fmt: skip
        _run(*inside, "iptables", "-A", "FORWARD", "-i", public, "-o", home, "-m", "conntrack",
             "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")  # fmt: skip
        _run(*inside, "iptables", "-A", "FORWARD", "-i", public, "-o", home, "-j", "DROP")

    def popen(self, name: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """`argv` run inside `name`'s namespace (killed on exit if still running)."""
        proc = subprocess.Popen([*self.exec_prefix(name), *argv], **kwargs)
        self._procs.append(proc)
        return proc

    def sent_bytes(self, name: str) -> int:
        """Bytes `name` sent through its shaped uplink so far (tc's counter)."""
        _, inner = self._veth(name)
        out = subprocess.run(
            ["ip", "netns", "exec", self.namespace(name), "tc", "-s", "qdisc", "show", "dev",
             inner], capture_output=True, text=True,
        )  # fmt: skip
        words = out.stdout.split()
        return int(words[words.index("Sent") + 1]) if "Sent" in words else 0

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        self._procs.clear()
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        for line in listed.stdout.splitlines():
            ns = line.split()[0] if line.split() else ""
            if ns.startswith(f"{self.tag}-"):
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True)
        for line in links.stdout.splitlines():
            fields = line.split(":")
            link = fields[1].strip().split("@")[0] if len(fields) > 1 else ""
            if link.startswith((f"{self.tag}v", f"{self.tag}n")):
                subprocess.run(["ip", "link", "del", link], capture_output=True)
        for bridge in (self.bridge, self.lan):
            subprocess.run(["ip", "link", "del", bridge], capture_output=True)

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.close()
