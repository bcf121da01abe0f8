"""Connection caps on loopback: per peer address (the warden), in total, and on handshakes."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lensemble.network.coordinator.connection_budget import plan_budget
from lensemble.network.coordinator.connection_warden import ConnectionWarden, look, shut_down
from lensemble.network.shared.metrics import Metrics
from tests.support.flood import Flood
from tests.support.network import network_mapping, write_config


def _eventually(condition: Callable[[], bool], within_s: float = 10.0) -> None:
    end = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < end, "the condition never held"
        time.sleep(0.05)


@pytest.fixture
def listener() -> Iterator[tuple[socket.socket, list[socket.socket]]]:
    """A listening socket of this process, and the server ends it accepted (kept open)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[socket.socket] = []
    yield server, accepted
    for sock in accepted:
        sock.close()
    server.close()


def _accept(server: socket.socket, accepted: list[socket.socket], count: int) -> None:
    while len(accepted) < count:
        accepted.append(server.accept()[0])


def test_the_warden_closes_an_addresss_newest_connections_beyond_its_cap(
    listener: tuple[socket.socket, list[socket.socket]],
) -> None:
    server, accepted = listener
    port = server.getsockname()[1]
    metrics = Metrics()
    warden = ConnectionWarden({port: "grpc"}, {port: 4}, metrics)
    flood = Flood("127.0.0.1", [port], sources=1)  # all from 127.0.0.2
    other = Flood("127.0.0.1", [port], sources=1)
    try:
        flood.open(idle=3, tls=0)
        _accept(server, accepted, 3)
        warden.sweep()  # the first three are seen first: they are the oldest
        flood.open(idle=7, tls=0)
        mine = socket.create_connection(("127.0.0.1", port))  # from 127.0.0.1
        mine.setblocking(False)
        other.sockets.append(mine)
        _accept(server, accepted, 11)
        assert warden.sweep() == 6
        kept = [not _closed(s) for s in flood.sockets]
        assert kept[:3] == [True] * 3  # seen in an earlier look: older than the rest
        assert sum(kept) == 4
        assert other.still_open() == 1  # another address, under its own cap
        counted = metrics.registry.get_sample_value("lensemble_connections", {"port": "grpc"})
        assert counted == 11  # counted before the cut
        closed = metrics.registry.get_sample_value(
            "lensemble_connections_closed_total", {"port": "grpc", "reason": "per_address"}
        )
        assert closed == 6
    finally:
        flood.close()
        other.close()


def test_only_the_socket_that_was_looked_at_is_ever_shut_down(
    listener: tuple[socket.socket, list[socket.socket]],
) -> None:
    server, accepted = listener
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    _accept(server, accepted, 1)
    ((_, inodes),) = look({port: "grpc"}).by_peer.items()
    (inode,) = inodes
    # A descriptor number reused for another file is left alone.
    assert not shut_down(accepted[0].fileno(), inode + 1)
    with open(os.devnull, "rb") as other:
        assert not shut_down(other.fileno(), inode)
    assert shut_down(accepted[0].fileno(), inode)
    client.settimeout(2)
    assert client.recv(1) == b""
    client.close()


def test_the_grpc_port_holds_at_most_its_budget_and_drops_silent_handshakes(
    tmp_path: Path,
) -> None:
    from dataclasses import replace

    from lensemble.federation.payload import manifest
    from lensemble.network.coordinator.authenticator import Authenticator
    from lensemble.network.coordinator.server import start_coordinator_server
    from lensemble.network.coordinator.transport import GrpcCoordinatorTransport
    from lensemble.network.shared.security import server_credentials
    from tests.support.federation import initial_params

    mapping = network_mapping(tmp_path)
    mapping["network"]["handshake_timeout_s"] = 1.0
    _, config = write_config(tmp_path, mapping)
    transport = GrpcCoordinatorTransport(config, next_round=0)
    budget = replace(plan_budget(config), grpc=5)
    server, port = start_coordinator_server(
        transport,
        Authenticator(config, config.participant_ids),
        server_credentials(config),
        host="127.0.0.1",
        port=0,
        architecture=manifest(initial_params(3)),
        budget=budget,
    )
    flood = Flood("127.0.0.1", [port], sources=4)
    try:
        flood.open(idle=8, tls=4)
        _eventually(lambda: flood.still_open() <= 5)  # beyond the total: closed at once
        _eventually(lambda: flood.still_open() == 0, within_s=5.0)  # silent: closed after 1 s
    finally:
        flood.close()
        server.stop(grace=0).wait(2)


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_running_out_of_descriptors_refuses_an_upload_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every update lands in a spool file (streams.LARGE = 1, and none is held in memory);
    # mapping the first one for judging fails with EMFILE, as when connections had taken every
    # descriptor. And clearing the spool folder fails once the same way.
    from lensemble.federation import spool as spool_module
    from lensemble.federation.intake import Landing
    from lensemble.network.shared import streams
    from lensemble.network.shared.transport_errors import BUSY
    from tests.support.federation import PARTICIPANTS
    from tests.support.network import LiveCoordinator, ParticipantThread

    monkeypatch.setattr(streams, "LARGE", 1)
    monkeypatch.setattr(spool_module, "MEMORY_PAYLOAD_BYTES", 0)
    failed: list[str] = []
    real_finish, real_glob = Landing.finish, Path.glob

    def finish(self: Landing) -> memoryview:
        if "finish" not in failed:
            failed.append("finish")
            raise OSError(errno.EMFILE, "Too many open files")
        return real_finish(self)

    def glob(self: Path, pattern: str) -> Iterator[Path]:
        if pattern.startswith("update-") and "reset" not in failed:
            failed.append("reset")
            raise OSError(errno.EMFILE, "Too many open files", str(self))
        return real_glob(self, pattern)

    monkeypatch.setattr(Landing, "finish", finish)
    monkeypatch.setattr(Path, "glob", glob)
    _, config = write_config(tmp_path, network_mapping(tmp_path, rounds=3))
    state = Path("/dev/shm") / f"lensemble-emfile-{os.getpid()}"
    try:
        with LiveCoordinator(config, output_dir=state) as live:
            threads = [ParticipantThread(config, pid) for pid in PARTICIPANTS]
            live.thread.join(60)
            for t in threads:
                t.thread.join(30)
                t.close()
            assert live.error is None, live.error
        assert sorted(failed) == ["finish", "reset"]
        assert [len(r.contributors) for r in live.result.records] == [4, 4, 4]
        assert live.metrics.rejected.labels(reason=BUSY)._value.get() == 1  # then resent
    finally:
        shutil.rmtree(state, ignore_errors=True)
