"""Every attack against the default config, 1 hostile of 4 and 2 of 8: short world-model runs.

Issue 36's acceptance in miniature (one seed, 3 rounds of 3 inner steps on small data; the full
grid is ``bench/attacks.py``, quoted in docs/security.md, and its slow test below): each run
goes through the real coordinator, participants and in-process transport with the shipped
defences, its record verifies, the attack shows in the ledger, and the model stays within
1.5 x the clean run's error on the honest sites' held-out episodes. A control with the norm
bound of before issue 36 shows the same check fails when the defence is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lensemble.config import LensembleConfig, load_config
from lensemble.data.trajectories import ParticipantData, load_or_collect
from lensemble.eval.heldout import evaluate
from lensemble.federation.coordinator import Coordinator, global_architecture
from lensemble.federation.faults import parse_faults
from lensemble.federation.inprocess import InProcessTransport
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.participant import Participant
from lensemble.federation.suspicion import SUSPECT_SCORE
from lensemble.federation.verify import verify_run
from lensemble.model.inner_loop import WorldModelLearner, initial_global_parameters
from tests.conftest import REPO

pytestmark = pytest.mark.integration

SMALL = [
    "federation.rounds=3",
    "federation.inner_steps=3",
    "federation.quorum=0",
    "data.episodes=8",
    "run.root_seed=7",
]
#: Attack -> its entry ({H}: each hostile participant); the sleeper wakes in round 1 of 3.
ATTACKS = {
    "scaled": "scaled:{H}@0-=-9.5",
    "alie": "alie:{H}@0-",
    "ipm": "ipm:{H}@0-=4",
    "minmax": "minmax:{H}@0-",
    "minsum": "minsum:{H}@0-",
    "sleeper": "scaled:{H}@1-=-9.5",
    "alie_omniscient": "alie_omniscient:{H}@0-",
}
SHAPES = {4: 1, 8: 2}


def _config(n: int, out: Path, *extra: str) -> LensembleConfig:
    overrides = [*SMALL, f"federation.participant_count={n}", f"run.output_dir={out}", *extra]
    return load_config(REPO / "config" / "local.yaml", overrides)


@pytest.fixture(scope="session")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ParticipantData]:
    """Every site's small data set, collected once (the same for N = 4 and its 4 of N = 8)."""
    config = _config(8, tmp_path_factory.mktemp("data"))
    return {pid: load_or_collect(config, pid) for pid in config.participant_ids}


def _run(
    config: LensembleConfig, data: dict[str, ParticipantData], spec: str
) -> tuple[list[RoundRecord], dict[str, Any]]:
    out = Path(config.run.output_dir)
    theta0 = initial_global_parameters(config)
    arch = global_architecture(theta0)
    participants = {
        pid: Participant(config, pid, WorldModelLearner(config, pid, data[pid]), arch, out)
        for pid in config.participant_ids
    }
    coordinator = Coordinator(config, theta0, output_dir=out, signer=None)
    summary = coordinator.run(InProcessTransport(participants, parse_faults(spec)))
    report = verify_run(out)
    assert report.first_break is None, report.first_break
    return summary.records, summary.params


def _honest_error(
    config: LensembleConfig, params: Any, data: dict[str, ParticipantData], hostile: list[str]
) -> float:
    honest = {p: data[p] for p in config.participant_ids if p not in hostile}
    return evaluate(config, params, honest).union.k_step_error


@pytest.fixture(scope="session")
def clean(
    datasets: dict[str, ParticipantData], tmp_path_factory: pytest.TempPathFactory
) -> dict[int, float]:
    """The clean run's honest-sites error, per N."""
    out = {}
    for n, f in SHAPES.items():
        config = _config(n, tmp_path_factory.mktemp(f"clean-{n}"))
        hostile = sorted(config.participant_ids)[:f]
        _, params = _run(config, datasets, "")
        out[n] = _honest_error(config, params, datasets, hostile)
    return out


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("n", sorted(SHAPES))
def test_an_attack_under_the_default_defences(
    attack: str,
    n: int,
    datasets: dict[str, ParticipantData],
    clean: dict[int, float],
    tmp_path: Path,
) -> None:
    config = _config(n, tmp_path)
    hostile = sorted(config.participant_ids)[: SHAPES[n]]
    spec = ",".join(ATTACKS[attack].format(H=h) for h in hostile)
    records, params = _run(config, datasets, spec)
    assert len(records) == 3 and all(r.state == "closed" for r in records)
    error = _honest_error(config, params, datasets, hostile)
    assert error <= 1.5 * clean[n], (error, clean[n])
    last = records[-1].defences
    for record in records:  # the mean never leaves out an honest participant
        assert set(record.defences["set_aside"]) <= set(hostile)  # type: ignore[arg-type]
    if attack in ("scaled", "sleeper"):
        # Named in the round it (first) attacks, left out of the mean from the next one on.
        named = records[1:] if attack == "scaled" else records[2:]
        assert all(set(r.defences["set_aside"]) == set(hostile) for r in named)  # type: ignore[arg-type]
        # Clipped to the round's median whenever it attacks, and named by its history.
        awake = records[1:] if attack == "sleeper" else records
        assert all(set(hostile) <= set(r.defences["clipped"]) for r in awake)
        assert all(last["suspicion"][h] >= SUSPECT_SCORE for h in hostile)
        assert max(v for p, v in last["suspicion"].items() if p not in hostile) < SUSPECT_SCORE
    if attack == "ipm":
        assert all(last["cosines"][h] < 0 for h in hostile)  # it pulls against the momentum


@pytest.mark.parametrize("n", sorted(SHAPES))
def test_a_named_attacker_s_pull_is_removed(
    n: int, datasets: dict[str, ParticipantData], tmp_path: Path
) -> None:
    # The hostile participants flip and scale by -9.5 in round 0 (and are named), then send
    # -9.5 x or +9.5 x their update: the same norms, opposite pulls. Set aside, both runs
    # commit the same models; only clipped (set_aside_suspects off), the pull shows.
    def chain(sign: str, setting: bool) -> list[str]:
        config = _config(
            n,
            tmp_path / f"{sign}{setting}",
            f"federation.robustness.set_aside_suspects={str(setting).lower()}",
        )
        hostile = sorted(config.participant_ids)[: SHAPES[n]]
        spec = ",".join(f"scaled:{h}@0=-9.5,scaled:{h}@1-={sign}9.5" for h in hostile)
        return [r.model_hash for r in _run(config, datasets, spec)[0]]

    assert chain("-", True) == chain("+", True)
    assert chain("-", False)[1:] != chain("+", False)[1:]


def test_the_same_check_fails_without_the_defence(
    datasets: dict[str, ParticipantData], clean: dict[int, float], tmp_path: Path
) -> None:
    # The bound of before issue 36 (10 x the median norm, the plain mean, no guard, nobody set
    # aside): a participant flipping and scaling its update by -9.5 stays under it every round.
    config = _config(
        4,
        tmp_path,
        "federation.robustness.median_factor=10",
        "federation.robustness.guard.enabled=false",
        "federation.robustness.set_aside_suspects=false",
    )
    records, params = _run(config, datasets, "scaled:alpine@0-=-9.5")
    assert not any(r.defences["clipped"] for r in records)
    assert _honest_error(config, params, datasets, ["alpine"]) > 1.5 * clean[4]


@pytest.mark.slow
@pytest.mark.full
def test_the_five_seed_grid_meets_the_targets(tmp_path: Path) -> None:
    """``bench/attacks.py`` over 5 seeds (about 2 hours on 2 busy cores): issue 36's targets.

    On the honest sites' union, every attack ends within 1.5 x the clean run's error; with no
    attack the defences cost at most 2% of the plain mean's union error, and the divergence
    guard never rolls back an honest run, over every seed. (Below the best site alone is
    reported by the bench's table, not asserted: docs/security.md says where it is not met.)
    ``LENSEMBLE_ATTACK_GRID`` names the bench's JSON lines of an earlier run of the same code
    to check (the bench only adds the rows it lacks) instead of training them all again.
    """
    out = Path(os.environ.get("LENSEMBLE_ATTACK_GRID", tmp_path / "attacks.jsonl"))
    env = {**os.environ, "PYTHONPATH": str(REPO / "runtime")}
    bench = [str(REPO / "bench" / "attacks.py"), "-n", "4", "-n", "8", "--seeds", "1,2,3,4,7"]
    subprocess.run(
        [sys.executable, *bench, "--out", str(out)],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by = {(r["n"], r["seed"], r["run"]): r for r in rows}
    for (n, seed, run), row in by.items():
        if run in ("alone", "clean", "clean, plain mean"):
            continue
        assert row["honest"] <= 1.5 * by[(n, seed, "clean")]["honest"], (n, seed, run)
    for n, seed, run in by:
        if run == "clean":
            plain = by[(n, seed, "clean, plain mean")]["union"]
            assert by[(n, seed, run)]["union"] <= 1.02 * plain, (n, seed)
            assert by[(n, seed, run)]["rollbacks"] == [], (n, seed)
