"""How many connections each port of the coordinator may hold, below its open-file limit.

Every accepted connection costs a descriptor until it is closed, and so does every file the
coordinator opens for itself. The budget keeps a reserve for the latter (what is open at start,
plus the spool's files per participant and the ledger, checkpoint and lock files) and gives the
ports the rest, so that no number of connections can make a spool, ledger or checkpoint write
fail with "Too many open files":

- the health and metrics ports hold a few connections each (probes and scrapers);
- the model download port holds two per participant plus one address's worth;
- the gRPC port holds the rest, up to :data:`MAX_GRPC_CONNECTIONS` (each costs memory too).

One peer address may hold at most ``network.max_connections_per_address`` connections on each
port (unset: 2 x the participants + 8), so one flooding host cannot fill a port's total.
"""

from __future__ import annotations

from dataclasses import dataclass

from lensemble.config import LensembleConfig
from lensemble.network.shared.file_limits import descriptors_in_use, open_file_limit
from lensemble.network.shared.health import HEALTH_CONNECTIONS
from lensemble.network.shared.metrics_server import MAX_CONNECTIONS as METRICS_CONNECTIONS

#: Descriptors kept for the coordinator's own files beyond those open at start: ledger,
#: checkpoint and their folders, the run lock, spool cleanup, /proc reads, late imports.
FIXED_RESERVE = 64
#: Descriptors kept per participant: its spool entry, the file its upload lands in, the
#: mapping that judges it, and a kept file for the next attempt.
RESERVE_PER_PARTICIPANT = 4
#: Connections the gRPC port keeps for each participant beyond one address's worth: its
#: channel, and the one that replaces it after a cut.
GRPC_PER_PARTICIPANT = 2
#: The most connections the gRPC port holds, however high the limit (each holds buffers).
MAX_GRPC_CONNECTIONS = 16384
#: Connections the download port keeps for each participant (its persistent one and a spare).
DOWNLOAD_PER_PARTICIPANT = 2


def per_address_cap(config: LensembleConfig) -> int:
    """Connections one peer address may hold on each port (count)."""
    configured = config.network.max_connections_per_address
    return configured if configured is not None else 2 * len(config.participant_ids) + 8


@dataclass(frozen=True)
class ConnectionBudget:
    """Connections each port may hold at once, and what that leaves for the coordinator.

    Attributes:
        limit: The soft open-file limit the budget was planned for (descriptors).
        reserve: Descriptors kept for the coordinator's own files (count).
        grpc: Connections of the gRPC port, handshakes included.
        download: Connections of the model download port.
        health: Connections of the health port.
        metrics: Connections of the metrics port.
        per_address: Connections one peer address may hold on each port.
        short: True when the limit is below what the minimum caps need: the caps are then the
            minimum, and descriptors can run out (the coordinator says so at start).
    """

    limit: int
    reserve: int
    grpc: int
    download: int
    health: int
    metrics: int
    per_address: int
    short: bool

    def minimum_limit(self) -> int:
        """The open-file limit these caps need (descriptors)."""
        return self.reserve + self.grpc + self.download + self.health + self.metrics


def plan_budget(
    config: LensembleConfig, limit: int | None = None, in_use: int | None = None
) -> ConnectionBudget:
    """Split ``limit`` descriptors between the coordinator's own files and its ports.

    Args:
        config: The run's config (participants, ``network.max_connections_per_address``).
        limit: The soft open-file limit (default: this process's, now).
        in_use: Descriptors already open (default: this process's, now).
    """
    limit = open_file_limit() if limit is None else limit
    in_use = descriptors_in_use() if in_use is None else in_use
    participants = len(config.participant_ids)
    per_address = per_address_cap(config)
    reserve = in_use + FIXED_RESERVE + RESERVE_PER_PARTICIPANT * participants
    download = DOWNLOAD_PER_PARTICIPANT * participants + per_address
    minimum_grpc = GRPC_PER_PARTICIPANT * participants + per_address
    left = limit - reserve - download - HEALTH_CONNECTIONS - METRICS_CONNECTIONS
    return ConnectionBudget(
        limit=limit,
        reserve=reserve,
        grpc=max(minimum_grpc, min(left, MAX_GRPC_CONNECTIONS)),
        download=download,
        health=HEALTH_CONNECTIONS,
        metrics=METRICS_CONNECTIONS,
        per_address=per_address,
        short=left < minimum_grpc,
    )
