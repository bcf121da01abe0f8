"""Helpers for network transport tests: configs on disk, certificates, process federations."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from lensemble.config import LensembleConfig, load_config
from lensemble.config.load import validate_mapping
from lensemble.federation.ledger import Ledger, RoundRecord, committed_chain
from lensemble.network.launch.launcher import LocalFederation, free_port
from lensemble.network.shared.certs import init_certs
from tests.support.cli import run_cli
from tests.support.federation import small_federation

REPO = Path(__file__).resolve().parents[2]
NETPROC = (sys.executable, "-m", "tests.support.netproc")


def network_mapping(tmp: Path, **federation: Any) -> dict[str, Any]:
    """A 4-participant mTLS config (as a mapping) with short timeouts, output under ``tmp``."""
    fed = small_federation(**{"transport": "network", **federation})
    certs = tmp / "certs"
    return {
        "run": {"name": "nettest", "root_seed": 3, "output_dir": str(tmp / "run")},
        "federation": fed,
        "network": {
            "auth": "mtls",
            "port": free_port(),
            "download_port": free_port(),
            "tls": {
                "enabled": True,
                "client_auth": True,
                "ca_file": str(certs / "ca.crt"),
                "cert_file": str(certs / "{identity}" / "tls.crt"),
                "key_file": str(certs / "{identity}" / "tls.key"),
            },
            "rpc_timeout_s": 4,
            "connect_backoff_max_s": 0.5,
        },
        "observability": {"log_format": "json"},
    }


def write_config(tmp: Path, mapping: dict[str, Any]) -> tuple[Path, LensembleConfig]:
    """Validate ``mapping``, write it as YAML, and issue its development certificates."""
    config = validate_mapping(mapping)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(mapping, sort_keys=False), encoding="utf-8")
    if config.network.tls.enabled:
        init_certs(tmp / "certs", config)
    return path, config


def federation(tmp: Path, config_path: Path, **kwargs: Any) -> LocalFederation:
    """A process federation running the quadratic-learner harness (``tests.support.netproc``)."""
    return LocalFederation(config_path, [], tmp / "logs", program=NETPROC, cwd=REPO, **kwargs)


def ledger(config: LensembleConfig) -> list[RoundRecord]:
    """The run's ledger records."""
    return Ledger(Path(config.run.output_dir) / config.observability.ledger_path).records()


def chain(config: LensembleConfig) -> list[str]:
    """The committed hash chain of the run's ledger (checked to chain)."""
    return committed_chain(ledger(config))


class LiveCoordinator:
    """A coordinator with its gRPC server in this process, running rounds in a thread.

    Args:
        config: The run's config (``network.port`` is the port served).
        output_dir: Checkpoints and ledger (None keeps the state in memory).
    """

    def __init__(self, config: LensembleConfig, output_dir: Path | None = None) -> None:
        from lensemble.federation.coordinator import Coordinator
        from lensemble.network.coordinator.authenticator import Authenticator
        from lensemble.network.coordinator.download_server import start_model_download
        from lensemble.network.coordinator.round_events import CoordinatorEvents
        from lensemble.network.coordinator.server import start_coordinator_server
        from lensemble.network.coordinator.transport import GrpcCoordinatorTransport
        from lensemble.network.shared.metrics import Metrics
        from lensemble.network.shared.security import coordinator_tokens, server_credentials
        from tests.support.federation import initial_params

        self.config = config
        self.metrics = Metrics()
        self.coordinator = Coordinator(
            config,
            initial_params(config.run.root_seed),
            output_dir=output_dir,
            resume=output_dir is not None,
            observer=CoordinatorEvents(self.metrics, config.federation.quorum),
        )
        self.transport = GrpcCoordinatorTransport(
            config, next_round=self.coordinator.version, metrics=self.metrics
        )
        auth = Authenticator(config, config.participant_ids, coordinator_tokens(config))
        self.server, self.port = start_coordinator_server(
            self.transport,
            auth,
            server_credentials(config),
            host="127.0.0.1",
            port=config.network.port,
            architecture=self.coordinator.architecture,
        )
        self.download = start_model_download(
            self.transport, auth, config, port=config.network.download_port
        )
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="coordinator", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.coordinator.run(self.transport)
        except BaseException as exc:
            self.error = exc

    def close(self) -> None:
        """Stop the rounds and the server."""
        self.transport.request_stop()
        self.thread.join(10)
        if self.download is not None:
            self.download.stop()
        self.server.stop(grace=0.5).wait(2)

    def __enter__(self) -> LiveCoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ParticipantThread:
    """A participant loop (quadratic learner) in a thread of this process."""

    def __init__(
        self,
        config: LensembleConfig,
        pid: str,
        output_dir: Path | None = None,
        token: str | None = None,
    ) -> None:
        from lensemble.federation.participant import Participant
        from lensemble.federation.payload import manifest
        from lensemble.network.participant.client import CoordinatorClient
        from lensemble.network.participant.loop import ParticipantLoop
        from tests.support.federation import QuadraticLearner, initial_params

        theta0 = initial_params(config.run.root_seed)
        participant = Participant(
            config, pid, QuadraticLearner(pid, config.run.root_seed), manifest(theta0), output_dir
        )
        self.client = CoordinatorClient(config, pid, token=token, architecture=manifest(theta0))
        self.loop = ParticipantLoop(config, participant, self.client)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"participant-{pid}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.loop.run()
        except BaseException as exc:
            self.error = exc

    def close(self) -> None:
        """Stop the loop and close the channel."""
        self.loop.stop.set()
        self.thread.join(10)
        self.client.close()


def local_config_with_certs(certs: Path, *overrides: str) -> LensembleConfig:
    """``config/local.yaml`` with TLS on and development certificates issued under ``certs``."""
    done = run_cli("certs", "init", str(certs))
    assert done.code == 0, done.err
    return load_config(
        REPO / "config/local.yaml",
        [
            "network.tls.enabled=true",
            f"network.tls.ca_file={certs}/ca.crt",
            f"network.tls.cert_file={certs}/{{identity}}/tls.crt",
            f"network.tls.key_file={certs}/{{identity}}/tls.key",
            *overrides,
        ],
    )
