"""The network transport over emulated WAN links: goodput against the shaped rate, round time.

Needs root (network namespaces, ``tc``, ``iptables``); anywhere else it prints why and exits 0
with "skipped". Each participant runs in a namespace of its own, joined to the coordinator's
namespace by a veth pair shaped to its link profile:

* **Rate**: a ``tbf`` queueing discipline on each end's egress: the participant's end at the
  upload rate, the coordinator's end at the download rate.
* **Delay**: ``netem`` on both egresses when the kernel has it (checked at run time), else a
  relay in the participant's namespace: the participant dials 127.0.0.1, and the relay holds
  every piece it reads for the one-way delay (half the RTT) in each direction before it
  forwards it over the shaped link (bounded: at most twice the link's bandwidth-delay product
  held per direction). The output names which one was used.
* **Loss**: ``iptables -m statistic --mode random`` DROP rules in the participant's namespace,
  on its link in both directions; segmentation offload is turned off on lossy links so that a
  drop is one packet, not a 64 KB burst.

The relay splits every TCP connection in two at the participant's end: the TCP connection over
the shaped link sees the rate and the loss but not the delay, while everything end to end
(HTTP/2 flow-control windows, request-response turns, TLS handshakes) sees the full RTT. So
TCP's own limits on a long link (socket buffers, loss recovery at 80 ms) are not exercised by
the relay; ``raw`` columns measure what a plain TCP stream gets through the same path, the
ceiling any protocol over it can reach.

A real coordinator and N participant processes (``LocalFederation``, mutual TLS, learners that
do no training: one scaled copy, plus ``--compute-s`` seconds of sleep) run a few rounds per
profile and model size. Each participant times its own transfers: the model download from the
call until the payload is in memory (the download port, FetchModel when that fails) and the
update upload from the call until the coordinator's verdict. Goodput is payload bits over that
time, as a fraction of the link's shaped rate (which also carries TCP/IP, TLS and framing
headers: about 0.95 is the most a payload can get). The first round is left out (joining,
connection set-up).

    sudo python bench/wan.py                                   # every profile, 1M and 10M
    sudo python bench/wan.py --profiles 100M-80ms --params 1M --participants 2 --rounds 3
    sudo python bench/wan.py --set network.upload_window_bytes=16777216 --out wan.jsonl

Every namespace, link and rule this bench makes is named ``wanb-*`` and removed on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
GRPC_PORT, DOWNLOAD_PORT, RAW_PORT = 50051, 50053, 50055
#: Where a participant process of this bench appends one JSON line per timed transfer.
TRANSFERS_ENV = "LENSEMBLE_WAN_TRANSFERS"
#: Where the coordinator process appends when each update stream was in.
STREAMS_ENV = "LENSEMBLE_WAN_STREAMS"
TENSORS = 8
MiB = 1 << 20


@dataclass(frozen=True)
class Link:
    """One participant's link to the coordinator.

    Attributes:
        up_mbit: Participant -> coordinator rate (Mbit/s).
        down_mbit: Coordinator -> participant rate (Mbit/s).
        rtt_ms: Round-trip time added to the link (milliseconds).
        loss: Probability that a packet is dropped, each direction (0-1).
    """

    up_mbit: float
    down_mbit: float
    rtt_ms: float
    loss: float = 0.0

    def text(self) -> str:
        """``100/100 Mbit/s 80 ms 0.1%`` style."""
        loss = f" {self.loss * 100:g}% loss" if self.loss else ""
        return f"{self.up_mbit:g}/{self.down_mbit:g} Mbit/s {self.rtt_ms:g} ms{loss}"


@dataclass(frozen=True)
class Profile:
    """A link for every participant; ``slow`` overrides the first participant's."""

    name: str
    link: Link
    slow: Link | None = None

    def link_of(self, index: int) -> Link:
        """The link of participant ``index``."""
        return self.slow if self.slow is not None and index == 0 else self.link


PROFILES = {
    p.name: p
    for p in (
        Profile("100M-80ms", Link(100, 100, 80, 0.001)),
        Profile("1G-40ms", Link(1000, 1000, 40)),
        # One site with a slow upload among sites on the first profile's link (no loss).
        Profile("slow-site", Link(100, 100, 80), slow=Link(20, 100, 80)),
        # A control: the second profile's rate without its delay (what the CPU allows).
        Profile("1G-0ms", Link(1000, 1000, 0)),
    )
}


def profile_named(name: str) -> Profile:
    """A profile of :data:`PROFILES`, or ``link:UP:DOWN:RTT[:LOSS]`` (Mbit/s, ms, 0-1)."""
    if name in PROFILES:
        return PROFILES[name]
    parts = name.split(":")
    if parts[0] != "link" or len(parts) not in (4, 5):
        raise SystemExit(
            f"--profiles: unknown profile {name!r}; choose from {list(PROFILES)} or write "
            "link:UP:DOWN:RTT[:LOSS] (Mbit/s, Mbit/s, ms, probability)"
        )
    return Profile(name, Link(*(float(x) for x in parts[1:])))


#: The profiles run by default (the control only when asked for).
DEFAULT_PROFILES = ("100M-80ms", "1G-40ms", "slow-site")


# ------------------------------------------------------------------------ namespaces, links
def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command (raises on failure when ``check``)."""
    return subprocess.run(args, check=check, capture_output=True, text=True, timeout=30)


def netem_available() -> bool:
    """Whether this kernel has the ``netem`` queueing discipline (tried in a scratch netns)."""
    ns = f"wanb-{uuid.uuid4().hex[:6]}-probe"
    try:
        run("ip", "netns", "add", ns)
        run("ip", "-n", ns, "link", "add", "wanb-pa", "type", "veth", "peer", "name", "wanb-pb")
        tried = run(
            "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "wanb-pa", "root", "netem",
            "delay", "1ms", check=False,
        )  # fmt: skip
        return tried.returncode == 0
    finally:
        run("ip", "netns", "del", ns, check=False)


@dataclass
class Net:
    """The namespaces of one run: ``coordinator`` and ``participants[i]``.

    Attributes:
        coordinator: The coordinator's namespace.
        participants: Participant index -> its namespace.
        address: Participant index -> the coordinator's address on that participant's link.
        delay: ``netem`` or ``relay``: what adds the delay.
    """

    coordinator: str
    participants: list[str] = field(default_factory=list)
    address: list[str] = field(default_factory=list)
    delay: str = "relay"

    @staticmethod
    def exec_in(ns: str) -> list[str]:
        """The command prefix that runs a program in ``ns``."""
        return ["ip", "netns", "exec", ns]


def _tbf(ns: str, dev: str, mbit: float, child_netem: Sequence[str]) -> None:
    rate_bytes = mbit * 1e6 / 8
    burst = max(64 * 1024, int(rate_bytes / 250))  # one timer tick's worth at HZ=250
    run(
        "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:",
        "tbf", "rate", f"{mbit:g}mbit", "burst", str(burst), "latency", "25ms",
    )  # fmt: skip
    if child_netem:
        run(
            "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "parent", "1:1",
            "handle", "10:", "netem", *child_netem,
        )  # fmt: skip


@contextmanager
def network(links: Sequence[Link], use_netem: bool) -> Iterator[Net]:
    """A coordinator namespace and one shaped link and namespace per entry of ``links``."""
    tag = uuid.uuid4().hex[:4]
    net = Net(f"wanb-{tag}-c", delay="netem" if use_netem else "relay")
    created = [net.coordinator]
    try:
        run("ip", "netns", "add", net.coordinator)
        run("ip", "-n", net.coordinator, "link", "set", "lo", "up")
        for i, link in enumerate(links):
            ns = f"wanb-{tag}-{i}"
            run("ip", "netns", "add", ns)
            created.append(ns)
            outer, inner = f"wanb{tag}c{i}", f"wanb{tag}p{i}"
            run(
                "ip", "link", "add", outer, "netns", net.coordinator, "type", "veth", "peer",
                inner, "netns", ns,
            )  # fmt: skip
            run("ip", "-n", net.coordinator, "addr", "add", f"10.232.{i}.1/30", "dev", outer)
            run("ip", "-n", ns, "addr", "add", f"10.232.{i}.2/30", "dev", inner)
            for namespace, dev in ((net.coordinator, outer), (ns, inner), (ns, "lo")):
                run("ip", "-n", namespace, "link", "set", dev, "up")
            if link.loss:  # one drop is one packet, not a segmentation-offload burst
                for namespace, dev in ((net.coordinator, outer), (ns, inner)):
                    run("ip", "-n", namespace, "link", "set", dev, "gso_max_size", "1500")
                for chain, way in (("OUTPUT", "-o"), ("INPUT", "-i")):
                    run(
                        *net.exec_in(ns), "iptables", "-A", chain, way, inner, "-m",
                        "statistic", "--mode", "random", "--probability", f"{link.loss:g}",
                        "-j", "DROP",
                    )  # fmt: skip
            half = [] if not use_netem else ["delay", f"{link.rtt_ms / 2:g}ms", "limit", "100000"]
            _tbf(ns, inner, link.up_mbit, half)
            _tbf(net.coordinator, outer, link.down_mbit, half)
            net.participants.append(ns)
            net.address.append(f"10.232.{i}.1")
        yield net
    finally:
        for ns in created:  # deleting a namespace deletes its veth ends, qdiscs and rules
            run("ip", "netns", "del", ns, check=False)


# ------------------------------------------------------------------------------- relay
async def _carry(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float, cap: int
) -> None:
    """Forward ``reader`` to ``writer``, each piece ``delay_s`` after it was read.

    At most ``cap`` bytes wait in the delay line; reading pauses while it is full, so a slow
    receiver slows the sender down as a full link would.
    """
    loop = asyncio.get_running_loop()
    line: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
    held = 0
    room = asyncio.Event()
    room.set()

    async def take() -> None:
        nonlocal held
        while True:
            await room.wait()
            data = await reader.read(256 * 1024)
            line.put_nowait((loop.time() + delay_s, data))
            if not data:
                return
            held += len(data)
            if held >= cap:
                room.clear()

    async def give() -> None:
        nonlocal held
        while True:
            due, data = await line.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                with suppress(OSError, RuntimeError):
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()
            held -= len(data)
            if held < cap:
                room.set()

    taker = asyncio.ensure_future(take())
    try:
        await give()
    finally:
        taker.cancel()


async def _relay(ports: Sequence[int], target: str, delay_s: float, cap: int) -> None:
    async def serve(port: int) -> asyncio.Server:
        async def handle(in_r: asyncio.StreamReader, in_w: asyncio.StreamWriter) -> None:
            try:
                out_r, out_w = await asyncio.open_connection(target, port, limit=MiB)
            except OSError:
                in_w.close()
                return
            for w in (in_w, out_w):
                sock = w.get_extra_info("socket")
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            ways = [
                asyncio.ensure_future(_carry(in_r, out_w, delay_s, cap)),
                asyncio.ensure_future(_carry(out_r, in_w, delay_s, cap)),
            ]
            # One way failing (a reset) ends both; a clean end of one waits for the other.
            _, pending = await asyncio.wait(ways, return_when=asyncio.FIRST_EXCEPTION)
            for task in pending:
                task.cancel()
            for w in (in_w, out_w):
                w.close()

        return await asyncio.start_server(handle, "127.0.0.1", port, limit=MiB)

    servers = [await serve(p) for p in ports]
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await asyncio.gather(*(s.serve_forever() for s in servers))


def start_relay(ns: str, target: str, link: Link) -> subprocess.Popen[str]:
    """A delay relay in ``ns`` for the coordinator's ports at ``target`` (until killed)."""
    delay_s = link.rtt_ms / 2000
    fastest = max(link.up_mbit, link.down_mbit) * 1e6 / 8
    cap = max(4 * MiB, int(2 * fastest * delay_s))
    ports = ",".join(str(p) for p in (GRPC_PORT, DOWNLOAD_PORT, RAW_PORT))
    argv = [*Net.exec_in(ns), sys.executable, str(HERE), "_relay", ports, target]
    proc = subprocess.Popen([*argv, str(delay_s), str(cap)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit(f"the relay in {ns} did not start")
    return proc


# ---------------------------------------------------------------------- raw TCP ceiling
def _raw_server(port: int) -> None:
    """Serve raw transfers: ``U size`` reads size bytes then answers; ``D size`` sends them."""
    block = bytes(MiB)
    with socket.create_server(("0.0.0.0", port)) as listener:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        while True:
            conn, _ = listener.accept()
            with conn:
                head = conn.recv(9, socket.MSG_WAITALL)
                kind, size = head[:1], int.from_bytes(head[1:], "big")
                if kind == b"U":
                    got = 0
                    while got < size:
                        n = len(conn.recv(MiB))
                        if n == 0:
                            break
                        got += n
                    conn.sendall(b"k")
                else:
                    sent = 0
                    while sent < size:
                        piece = block[: min(MiB, size - sent)]
                        conn.sendall(piece)
                        sent += len(piece)


def _raw_client(host: str, port: int, size: int) -> None:
    """Time one raw upload and one download of ``size`` bytes; print them as JSON."""
    result = {}
    for kind in (b"U", b"D"):
        with socket.create_connection((host, port)) as conn:
            conn.sendall(kind + size.to_bytes(8, "big"))
            start = time.perf_counter()
            if kind == b"U":
                block = bytes(MiB)
                sent = 0
                while sent < size:
                    conn.sendall(block[: min(MiB, size - sent)])
                    sent += min(MiB, size - sent)
                conn.recv(1)
            else:
                got = 0
                while got < size:
                    n = len(conn.recv(MiB))
                    if n == 0:
                        break
                    got += n
            result["up_s" if kind == b"U" else "down_s"] = time.perf_counter() - start
    print(json.dumps(result))


def raw_ceiling(net: Net, index: int, host: str, size: int) -> dict[str, float]:
    """Seconds of one raw TCP upload and download of ``size`` bytes over ``index``'s link."""
    argv = [*Net.exec_in(net.participants[index]), sys.executable, str(HERE), "_raw_client"]
    out = subprocess.run(
        [*argv, host, str(RAW_PORT), str(size)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


# ------------------------------------------------------------------------- the federation
def make_params(total: int) -> dict[str, Any]:
    """``total`` float32 parameters in eight tensors (seeded)."""
    import torch

    g = torch.Generator().manual_seed(0)
    size = total // TENSORS
    return {f"layer.{i}.weight": torch.randn(size, generator=g) for i in range(TENSORS)}


class SleepLearner:
    """No training: the global parameters scaled by a participant factor, after a sleep."""

    def __init__(self, participant_id: str, compute_s: float) -> None:
        self.factor = 1.0 - 1e-3 * (1 + int(participant_id[1:]))
        self.compute_s = compute_s

    def train_round(self, global_params: Mapping[str, Any], round_index: int, steps: int) -> Any:
        """One scaled copy (after ``compute_s`` seconds standing for the inner steps)."""
        from lensemble.learner import LocalRound

        if self.compute_s:
            time.sleep(self.compute_s)
        return LocalRound({k: v * self.factor for k, v in global_params.items()}, 0.0, 0.0)

    def heldout_loss(self, global_params: Mapping[str, Any]) -> None:
        """No held-out data."""
        return None

    def inner_state(self) -> dict[str, Any]:
        """No inner state."""
        return {}

    def load_inner_state(self, state: Mapping[str, Any]) -> None:
        """No inner state."""


def _note(path: Path, **line: Any) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def _time_transfers(path: Path) -> None:
    """Append every fetch and submit of this process's client to ``path`` (JSON lines).

    A line holds the transfer's ``start`` and ``end`` (``time.monotonic``, one clock for every
    namespace of the machine), so that an upload's start can be matched with the moment its
    last chunk reached the coordinator (:func:`_time_streams`).
    """
    from lensemble.network.participant.client import CoordinatorClient

    fetch, submit = CoordinatorClient.fetch, CoordinatorClient.submit

    def timed_fetch(self: Any, announcement: Any) -> bytes:
        start = time.monotonic()
        payload = fetch(self, announcement)
        end = time.monotonic()
        _note(path, kind="down", round=announcement.round_index, bytes=len(payload),
              start=start, end=end)  # fmt: skip
        return payload

    def timed_submit(self: Any, opening: Any, contribution: Any, before_last: Any = None) -> Any:
        start = time.monotonic()
        reply = submit(self, opening, contribution, before_last)
        end = time.monotonic()
        _note(path, kind="up", round=opening.round_index, bytes=len(contribution.payload),
              start=start, end=end)  # fmt: skip
        return reply

    CoordinatorClient.fetch = timed_fetch  # type: ignore[method-assign]
    CoordinatorClient.submit = timed_submit  # type: ignore[method-assign]


def _time_streams(path: Path) -> None:
    """Append when each update stream's last chunk was in (before judging) to ``path``."""
    from lensemble.network.coordinator.service import CoordinatorService

    assemble = CoordinatorService._assemble

    def timed(self: Any, first: Any, rest: Any, context: Any) -> Any:
        landed = assemble(self, first, rest, context)
        header = first.header
        _note(path, participant=header.participant_id, round=header.round_index,
              end=time.monotonic())  # fmt: skip
        return landed

    CoordinatorService._assemble = timed  # type: ignore[method-assign]


def _proc(argv: list[str]) -> None:
    """A coordinator or participant process of the bench (``LocalFederation``'s program)."""
    import torch

    from lensemble.config import load_config
    from lensemble.network.launch.harness import PortOptions
    from lensemble.network.launch.process import run_coordinator, run_participant

    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, required=True)
    parser.add_argument("--compute-s", type=float, default=0.0)
    parser.add_argument("role")
    parser.add_argument("--config")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--id")
    parser.add_argument("--health-port", type=int)
    parser.add_argument("--metrics-port", type=int)
    args = parser.parse_args(argv)
    config = load_config(args.config, args.set)
    ports = PortOptions(None, args.health_port, args.metrics_port)
    if args.role == "coordinator":
        _time_streams(Path(os.environ[STREAMS_ENV]))
        run_coordinator(config, lambda: make_params(args.params), ports)
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        _note(Path(os.environ[STREAMS_ENV]), peak_rss_mb=peak_mb)
    else:
        torch.set_num_threads(1)  # N participants share two cores with the coordinator
        _time_transfers(Path(os.environ[TRANSFERS_ENV]))
        theta0 = make_params(args.params)
        learner = lambda: SleepLearner(args.id, args.compute_s)  # noqa: E731
        run_participant(config, args.id, learner, theta0, ports)


def config_mapping(tmp: Path, ids: Sequence[str], rounds: int, use_relay: bool) -> dict[str, Any]:
    """mTLS, N participants, the coordinator on every address of its namespace."""
    certs = tmp / "certs"
    return {
        "run": {"name": "wan", "output_dir": str(tmp / "run")},
        "federation": {
            "participants": [{"id": p} for p in ids],
            "rounds": rounds,
            "inner_steps": 1,
            "quorum": len(ids),
            "round_timeout_s": 1200,
            "join_timeout_s": 1800,
            "max_round_retries": 0,
            "straggler_factor": None,
            "transport": "network",
        },
        "network": {
            "listen_host": "0.0.0.0",
            "host": "127.0.0.1" if use_relay else "10.232.0.1",
            "port": GRPC_PORT,
            "download_port": DOWNLOAD_PORT,
            "auth": "mtls",
            "tls": {
                "enabled": True,
                "client_auth": True,
                "ca_file": str(certs / "ca.crt"),
                "cert_file": str(certs / "{identity}" / "tls.crt"),
                "key_file": str(certs / "{identity}" / "tls.key"),
            },
            "rpc_timeout_s": 120,
        },
        "observability": {"log_format": "json"},
    }


@dataclass
class Result:
    """One participant's figures for one profile and model size (medians over rounds)."""

    profile: str
    params: int
    participant: str
    link: str
    delay_by: str
    up_mbit: float
    down_mbit: float
    up_goodput_mbit: float
    down_goodput_mbit: float
    up_fraction: float
    up_verdict_fraction: float
    down_fraction: float
    raw_up_fraction: float
    raw_down_fraction: float
    round_wall_s: float
    round_period_s: float
    compute_s: float
    coordinator_peak_rss_mb: float
    overrides: list[str]


def run_profile(
    profile: Profile,
    params: int,
    *,
    n: int,
    rounds: int,
    use_netem: bool,
    overrides: Sequence[str],
    compute_s: float,
) -> list[Result]:
    """Run the federation over ``profile``'s links; one :class:`Result` per participant."""
    import yaml

    from lensemble.config.load import validate_mapping
    from lensemble.federation.ledger import Ledger
    from lensemble.network.launch.launcher import LocalFederation
    from lensemble.network.shared.certs import init_certs

    ids = [f"p{i}" for i in range(n)]
    links = [profile.link_of(i) for i in range(n)]
    payload = params * 4
    with tempfile.TemporaryDirectory() as folder, network(links, use_netem) as net:
        tmp = Path(folder)
        mapping = config_mapping(tmp, ids, rounds, use_relay=not use_netem)
        config = validate_mapping(mapping)
        path = tmp / "config.yaml"
        path.write_text(yaml.safe_dump(mapping), encoding="utf-8")
        init_certs(tmp / "certs", config, net.address)
        helpers: list[subprocess.Popen[str]] = []
        try:
            sink = [*Net.exec_in(net.coordinator), sys.executable, str(HERE), "_raw_server"]
            helpers.append(subprocess.Popen([*sink, str(RAW_PORT)], stdout=subprocess.PIPE))
            assert helpers[-1].stdout is not None
            helpers[-1].stdout.readline()
            if not use_netem:
                for i in range(n):
                    helpers.append(start_relay(net.participants[i], net.address[i], links[i]))
            host = [("127.0.0.1" if not use_netem else net.address[i]) for i in range(n)]
            raw = [raw_ceiling(net, i, host[i], payload) for i in range(n)]
            program = [sys.executable, str(HERE), "_proc", "--params", str(params)]
            program += ["--compute-s", str(compute_s)]
            transfers = {pid: tmp / f"{pid}.transfers.jsonl" for pid in ids}
            streams = tmp / "streams.jsonl"
            env = {STREAMS_ENV: str(streams)}
            with LocalFederation(
                path, list(overrides), tmp / "logs", program=program, env=env
            ) as fed:
                coordinator = fed.start_coordinator(wrapper=Net.exec_in(net.coordinator))
                procs = []
                for i, pid in enumerate(ids):
                    fed.env[TRANSFERS_ENV] = str(transfers[pid])
                    procs.append(
                        fed.start_participant(
                            pid,
                            [f"network.host={host[i]}"],
                            wrapper=Net.exec_in(net.participants[i]),
                        )
                    )
                if coordinator.wait(3600) != 0:
                    raise SystemExit(f"coordinator failed: {coordinator.last_error()}")
                for p in procs:
                    p.wait(120)
        finally:
            for proc in helpers:
                proc.kill()
                proc.wait()
        records = [r for r in Ledger(tmp / "run" / "ledger.jsonl").records() if r.round > 0]
        if not records or any(r.state != "closed" for r in records):
            raise SystemExit(f"{profile.name}: a round did not commit: {records}")
        wall = statistics.median(r.wall_s for r in records)
        # From one opening to the next: what a round costs when its training overlaps the
        # previous round's transfers (federation.overlap), where wall_s covers only a part.
        opened = [datetime.fromisoformat(r.opened_at) for r in records]
        period = (
            statistics.median((b - a).total_seconds() for a, b in itertools.pairwise(opened))
            if len(opened) > 1
            else float("nan")
        )
        compute = statistics.median(r.compute_s for r in records)
        notes = [json.loads(x) for x in streams.read_text().splitlines()]
        streamed = {(x["participant"], x["round"]): x["end"] for x in notes if "end" in x}
        peak_rss_mb = max((x["peak_rss_mb"] for x in notes if "peak_rss_mb" in x), default=0.0)
        results = []
        for i, pid in enumerate(ids):
            lines = [json.loads(x) for x in transfers[pid].read_text().splitlines()]
            lines = [x for x in lines if x["round"] > 0]
            for x in lines:  # an upload ends when its last chunk is in, before the judging
                x["in"] = (
                    streamed.get((pid, x["round"]), x["end"]) if x["kind"] == "up" else x["end"]
                )

            def goodput(kind: str, end: str = "in", lines: list[dict[str, Any]] = lines) -> float:
                rates = [
                    x["bytes"] * 8 / (x[end] - x["start"]) / 1e6 for x in lines if x["kind"] == kind
                ]
                return statistics.median(rates) if rates else float("nan")

            up, down, verdict = goodput("up"), goodput("down"), goodput("up", "end")
            link = links[i]
            results.append(
                Result(
                    profile=profile.name,
                    params=params,
                    participant=pid,
                    link=link.text(),
                    delay_by=net.delay,
                    up_mbit=link.up_mbit,
                    down_mbit=link.down_mbit,
                    up_goodput_mbit=up,
                    down_goodput_mbit=down,
                    up_fraction=up / link.up_mbit,
                    up_verdict_fraction=verdict / link.up_mbit,
                    down_fraction=down / link.down_mbit,
                    raw_up_fraction=payload * 8 / raw[i]["up_s"] / 1e6 / link.up_mbit,
                    raw_down_fraction=payload * 8 / raw[i]["down_s"] / 1e6 / link.down_mbit,
                    round_wall_s=wall,
                    round_period_s=period,
                    compute_s=compute,
                    coordinator_peak_rss_mb=peak_rss_mb,
                    overrides=list(overrides),
                )
            )
        return results


def parse_count(text: str) -> int:
    """``10M`` -> 10,000,000."""
    units = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def why_not() -> str | None:
    """Why this bench cannot run here (None: it can)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces, tc and iptables need root"
    missing = [t for t in ("ip", "tc", "iptables") if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not found on PATH"
    return None


def main() -> None:
    """Parse the flags, run every profile and size, print the table (and JSON lines)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--profiles", default=",".join(DEFAULT_PROFILES), help=f"some of {', '.join(PROFILES)}"
    )
    parser.add_argument("--params", default="1M,10M", help="model sizes, e.g. 1M,10M")
    parser.add_argument("--big", action="store_true", help="add 100M parameters")
    parser.add_argument("--participants", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="the first is left out")
    parser.add_argument("--compute-s", type=float, default=0.0, help="sleep per local round")
    parser.add_argument("--set", action="append", default=[], help="config override, repeatable")
    parser.add_argument("--relay", action="store_true", help="the relay even where netem is")
    parser.add_argument("--out", type=Path, help="append one JSON line per result here")
    args = parser.parse_args()
    reason = why_not()
    if reason is not None:
        print(f"skipped: {reason}.")
        return
    profiles = [profile_named(p) for p in args.profiles.split(",")]
    sizes = [parse_count(s) for s in args.params.split(",")] + ([10**8] if args.big else [])
    use_netem = not args.relay and netem_available()
    print(
        f"WAN links, N = {args.participants}, {args.rounds} rounds (the first left out), mTLS; "
        f"delay by {'netem' if use_netem else 'relay (this kernel has no netem)'}; "
        f"overrides: {args.set or 'none'}"
    )
    print(
        "| profile | params | participant | link (up/down, RTT, loss) | up Mbit/s | up / rate "
        "| up incl. verdict / rate | down Mbit/s | down / rate | raw TCP up / rate "
        "| raw TCP down / rate | round s | round period s | compute s "
        "| coordinator peak RSS MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for profile in profiles:
        for size in sizes:
            for r in run_profile(
                profile,
                size,
                n=args.participants,
                rounds=args.rounds,
                use_netem=use_netem,
                overrides=args.set,
                compute_s=args.compute_s,
            ):
                print(
                    f"| {r.profile} | {r.params / 1e6:g}M | {r.participant} | {r.link} "
                    f"| {r.up_goodput_mbit:.1f} | {r.up_fraction:.2f} "
                    f"| {r.up_verdict_fraction:.2f} "
                    f"| {r.down_goodput_mbit:.1f} "
                    f"| {r.down_fraction:.2f} | {r.raw_up_fraction:.2f} "
                    f"| {r.raw_down_fraction:.2f} | {r.round_wall_s:.2f} "
                    f"| {r.round_period_s:.2f} | {r.compute_s:.2f} "
                    f"| {r.coordinator_peak_rss_mb:.0f} |",
                    flush=True,
                )
                if args.out is not None:
                    with args.out.open("a", encoding="utf-8") as out:
                        out.write(json.dumps(asdict(r)) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_relay":
        ports = [int(p) for p in sys.argv[2].split(",")]
        asyncio.run(_relay(ports, sys.argv[3], float(sys.argv[4]), int(sys.argv[5])))
    elif len(sys.argv) > 1 and sys.argv[1] == "_raw_server":
        _raw_server(int(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_raw_client":
        _raw_client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_proc":
        from lensemble.machinery.allocator import keep_freed_buffers

        keep_freed_buffers()  # as the lensemble command does in every process
        _proc(sys.argv[2:])
    else:
        main()
