"""Network namespaces for multi-host tests: the coordinator's, and one per participant.

Each participant namespace is joined to the coordinator's by its own veth pair (a /30 link), so
a participant reaches the coordinator and nothing else. Needs root and iproute2 (the ``netns``
tool of :mod:`tests.support.tools`); every namespace is deleted on exit, which deletes its links
and firewall rules too.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.support.tools import require


def ip(*args: str) -> None:
    """Run ``ip ARGS`` (raises on failure)."""
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@dataclass
class Hosts:
    """Namespaces and links; ``address[pid]`` is the coordinator's address on pid's link.

    Attributes:
        coordinator: The coordinator's namespace.
        participants: Participant id (or any host name) -> its namespace.
        address: Host -> the coordinator's address on its link.
        link: Host -> its end of the link (inside its namespace).
        own: Host -> its own address on its link.
    """

    coordinator: str
    participants: dict[str, str]
    address: dict[str, str]
    link: dict[str, str]
    own: dict[str, str]

    @staticmethod
    def exec_in(namespace: str) -> list[str]:
        """The command prefix that runs a program in ``namespace``."""
        return ["ip", "netns", "exec", namespace]

    def set_link(self, pid: str, up: bool) -> None:
        """Bring ``pid``'s end of its link up or down."""
        ip("-n", self.participants[pid], "link", "set", self.link[pid], "up" if up else "down")

    def cut(self, pid: str) -> None:
        """Drop every packet in and out of ``pid``'s namespace (iptables): a silent cut.

        The link stays up and nothing is refused: the coordinator sees no reset, only silence.
        """
        for chain in ("INPUT", "OUTPUT"):
            subprocess.run(
                [*self.exec_in(self.participants[pid]), "iptables", "-A", chain, "-j", "DROP"],
                check=True,
                capture_output=True,
                timeout=20,
            )


@contextmanager
def namespaces(hosts: Iterable[str]) -> Iterator[Hosts]:
    """A coordinator namespace and one linked namespace per name in ``hosts``."""
    require("netns")
    tag = uuid.uuid4().hex[:5]
    coordinator = f"lens-{tag}-c"
    created = [coordinator]
    result = Hosts(coordinator, {}, {}, {}, {})
    try:
        ip("netns", "add", coordinator)
        ip("-n", coordinator, "link", "set", "lo", "up")
        for i, name in enumerate(sorted(hosts)):
            ns = f"lens-{tag}-{i}"
            ip("netns", "add", ns)
            created.append(ns)
            outer, inner = f"lc{tag}{i}", f"lp{tag}{i}"
            ip(
                "link",
                "add",
                outer,
                "netns",
                coordinator,
                "type",
                "veth",
                "peer",
                inner,
                "netns",
                ns,
            )
            ip("-n", coordinator, "addr", "add", f"10.231.{i}.1/30", "dev", outer)
            ip("-n", ns, "addr", "add", f"10.231.{i}.2/30", "dev", inner)
            for namespace, dev in ((coordinator, outer), (ns, inner), (ns, "lo")):
                ip("-n", namespace, "link", "set", dev, "up")
            result.participants[name] = ns
            result.address[name] = f"10.231.{i}.1"
            result.own[name] = f"10.231.{i}.2"
            result.link[name] = inner
        yield result
    finally:
        for ns in created:  # deleting a namespace also deletes its veth ends
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
