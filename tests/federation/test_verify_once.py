"""A resume reads the run record once: one ledger read and parse, one verification, one audit each.

The verified record (:class:`lensemble.federation.verify.VerifiedRecord`) is handed on to the
coordinator, the metrics recovery and the network coordinator process, so none of them reads
the ledger or checks a checkpoint again. Counted with wrappers on the real functions.
"""

from __future__ import annotations

import builtins
import pathlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lensemble.config.load import validate_mapping
from lensemble.federation import checkpoint, ledger, resume_record, verify, verify_checkpoints
from lensemble.federation.checkpoint import CheckpointStore
from tests.support.federation import build, small_config

LEDGER = "ledger.jsonl"


class Reads:
    """Counts of what a resume does with the run record."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: Counter[str] = Counter()
        self._patch = monkeypatch

    def count(self, module: Any, name: str, label: str | None = None) -> None:
        """Count calls of ``module.name`` (the real function still runs)."""
        real: Callable[..., Any] = getattr(module, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[label or name] += 1
            return real(*args, **kwargs)

        self._patch.setattr(module, name, counted)

    def count_ledger_reads(self) -> None:
        """Count every opening of a file named like the ledger to read it (any API)."""

        def counting(real: Callable[..., Any]) -> Callable[..., Any]:
            def opened(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
                if Path(str(file)).name == LEDGER and "r" in mode:
                    self.calls["ledger read"] += 1
                return real(file, mode, *args, **kwargs)

            return opened

        # Path.read_bytes and read_text go through Path.open, which calls io.open directly.
        self._patch.setattr(pathlib.Path, "open", counting(pathlib.Path.open))
        self._patch.setattr(builtins, "open", counting(builtins.open))


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    counter = Reads(monkeypatch)
    yield counter


def _count_everything(reads: Reads) -> None:
    reads.count_ledger_reads()
    reads.count(ledger, "parse_ledger_bytes", "parse")
    reads.count(verify, "parse_ledger_bytes", "parse")
    # The verification entry point, wherever it is bound.
    reads.count(verify, "require_valid")
    reads.count(resume_record, "require_valid")
    reads.count(verify, "verify_run")
    reads.count(verify_checkpoints, "audit_checkpoint")
    reads.count(checkpoint.CheckpointStore, "load")


def _previous_run(out: Path, rounds: int = 2) -> None:
    coord, transport, _ = build(small_config(rounds=rounds), output_dir=out)
    coord.run(transport)


def test_a_coordinator_resume_reads_and_verifies_the_record_once(
    tmp_path: Path, reads: Reads
) -> None:
    _previous_run(tmp_path)
    checkpoints = len(CheckpointStore(tmp_path).versions())
    _count_everything(reads)
    resumed, transport, _ = build(small_config(rounds=3), output_dir=tmp_path, resume=True)
    assert resumed.version == 2
    resumed.run(transport)
    assert reads.calls["ledger read"] == 1
    assert reads.calls["parse"] == 1
    assert reads.calls["require_valid"] == 1
    assert reads.calls["verify_run"] == 0
    assert reads.calls["audit_checkpoint"] == checkpoints  # each checkpoint once
    assert reads.calls["load"] == 0  # the coordinator continues from the audited tensors
    assert [r.round for r in resumed.history] == [0, 1, 2]


def test_a_torn_tail_is_repaired_without_reading_the_ledger_again(
    tmp_path: Path, reads: Reads
) -> None:
    _previous_run(tmp_path)
    path = tmp_path / LEDGER
    data = path.read_bytes()
    last = data.splitlines()[-1]
    path.write_bytes(data[: len(data) - 1 - len(last) // 2])  # a crash tore the last line
    _count_everything(reads)
    resumed, _, _ = build(small_config(rounds=3), output_dir=tmp_path, resume=True)
    assert resumed.version == 2
    assert path.read_bytes() == data  # restored from the checkpoint
    assert reads.calls["ledger read"] == 2  # the resume's one read, and this test's
    assert reads.calls["require_valid"] == 1
    assert reads.calls["audit_checkpoint"] == len(CheckpointStore(tmp_path).versions())


def test_the_network_coordinator_start_reads_and_verifies_the_record_once(
    tmp_path: Path, reads: Reads, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lensemble.network.launch import process
    from tests.support.federation import initial_params
    from tests.support.network import network_mapping

    mapping = network_mapping(tmp_path, rounds=3)
    mapping["network"].update(auth="insecure", tls={"enabled": False})
    config = validate_mapping(mapping)
    out = Path(config.run.output_dir)
    _previous_run(out)
    _count_everything(reads)
    reads.count(process, "require_valid")
    built: list[int] = []

    class Started(Exception):
        pass

    def transport(_config: object, *, next_round: int, **_kwargs: object) -> None:
        built.append(next_round)  # the coordinator exists and resumed: stop before serving
        raise Started

    monkeypatch.setattr(process, "GrpcCoordinatorTransport", transport)
    with pytest.raises(Started):
        process.run_coordinator(config, lambda: initial_params(3))
    assert built == [2]
    assert reads.calls["ledger read"] == 1
    assert reads.calls["parse"] == 1
    assert reads.calls["require_valid"] == 1
    assert reads.calls["verify_run"] == 0
    assert reads.calls["audit_checkpoint"] == len(CheckpointStore(out).versions())
    assert reads.calls["load"] == 0


@pytest.mark.integration  # two small world-model runs
def test_a_simulation_resume_reads_and_verifies_the_record_once(
    tmp_path: Path, reads: Reads
) -> None:
    from lensemble.simulation.in_process import run_in_process

    def config(rounds: int) -> Any:
        return validate_mapping(
            {
                "run": {"output_dir": str(tmp_path)},
                "data": {"episodes": 4, "episode_steps": 20},
                "federation": {"rounds": rounds, "inner_steps": 2},
                "evaluation": {"every_rounds": 2, "local_only_baseline": False},
            }
        )

    run_in_process(config(2))
    (tmp_path / "metrics.jsonl").unlink()  # lost lines: the recovery rebuilds them
    _count_everything(reads)
    result = run_in_process(config(3), resume=True)
    assert reads.calls["ledger read"] == 1
    assert reads.calls["parse"] == 1
    assert reads.calls["require_valid"] == 1
    assert reads.calls["verify_run"] == 0
    assert [r.round for r in result.records] == [0, 1, 2]


def test_a_record_verified_with_another_key_is_refused(tmp_path: Path) -> None:
    from lensemble.errors import ConfigError
    from lensemble.federation.coordinator import Coordinator
    from lensemble.federation.signing import HmacSigner
    from tests.support.federation import initial_params

    _previous_run(tmp_path)
    verified = verify.require_valid(tmp_path, LEDGER, None)
    with pytest.raises(ConfigError, match="verified for .* with key None"):
        Coordinator(
            small_config(rounds=3),
            initial_params(3),
            output_dir=tmp_path,
            resume=verified,
            signer=HmacSigner(b"k" * 32),
        )
    with pytest.raises(ConfigError, match="verified for"):
        Coordinator(small_config(), initial_params(3), output_dir=tmp_path / "x", resume=verified)
