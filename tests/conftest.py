"""Shared fixtures (the repository root, a working directory per test) and the test tiers.

Every test belongs to exactly one tier, so ``pytest -m unit`` is the contributor's quick loop
and plain ``pytest`` (CI) runs all of them:

- ``unit``: in one process (or a short child Python), no external tool, no server, no whole run;
  each test takes a second or two at most. The tier runs in under a minute on 2 cores.
- ``integration``: our code against a real external tool or OS service: Helm, kubectl,
  kubernetes-validate, docker compose, the Pulumi mock engine, gRPC servers on loopback, child
  processes that import torch, or minutes of training.
- ``e2e``: a whole federation or stack the way a user starts it: ``lensemble simulate``, the
  coordinator and participants as processes, a Compose stack, a kind cluster.

A test's tier comes from an explicit ``@pytest.mark.<tier>`` (on the test, class or module), else
from :data:`TIER_BY_PATH`, else ``unit``. A file whose default tier is not ``unit`` holds no unit
test, so ``-m unit`` does not even import it. The engine markers (docker, kind, netns, online,
worldmodel), ``slow`` and ``full`` say what else a test needs; none of them is allowed in the
unit tier. ``tests/test_tiers.py`` checks all of this.

Tests run in parallel (pytest-xdist, ``-n auto --dist loadscope`` in ``pyproject.toml``) on
:func:`pytest_xdist_auto_num_workers` workers. Each test file runs on one worker (its module
fixtures and caches are built once), and the files holding the slowest tests go out first
(:func:`run_order`), so no long file starts last. Every test holds a share of the machine; a
test that needs it alone (a Compose stack) waits for the others (:mod:`tests.support.machine`).
``full`` marks the full form of a suite that every run has in a smaller form; it runs only with
``LENSEMBLE_FULL_SUITES=1`` (:data:`FULL_SUITES_ENV`).
"""

from __future__ import annotations

import os
from fnmatch import fnmatch
from pathlib import Path

import pytest

from tests.support import machine

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

TIERS = ("unit", "integration", "e2e")

#: Default tier of the tests in a file, by its path under ``tests/`` (first match wins).
TIER_BY_PATH: tuple[tuple[str, str], ...] = (
    ("e2e/*", "e2e"),
    ("*_e2e.py", "e2e"),
    ("network/test_processes.py", "e2e"),  # coordinator and participants as processes
    ("network/test_local_processes.py", "e2e"),  # lensemble simulate over the network transport
    ("network/test_privacy_processes.py", "e2e"),  # DP participants as processes
    ("network/test_central_privacy_processes.py", "e2e"),  # central DP as processes
    ("network/test_wan.py", "e2e"),  # processes over shaped links in network namespaces
    ("network/test_abstain_processes.py", "e2e"),  # a rank failure over the network, as processes
    ("network/test_multihost.py", "e2e"),  # processes in network namespaces
    ("adversarial/test_network_idle_streams.py", "e2e"),  # a hostile client vs processes
    ("adversarial/test_network_dead_participant.py", "e2e"),  # SIGKILL during a run
    ("adversarial/test_network_message_cap.py", "e2e"),  # processes refusing an impossible cap
    ("adversarial/test_network_frozen_participant.py", "e2e"),  # SIGSTOP, cut, kill mid-round
    ("adversarial/test_network_connection_flood.py", "e2e"),  # a flood vs a low nofile limit
    ("network/test_grpc.py", "integration"),  # gRPC servers on loopback
    ("network/test_abstain_grpc.py", "integration"),  # Abstain through a real gRPC server
    ("network/test_model_download.py", "integration"),  # the download port on loopback
    ("network/test_connection_caps.py", "integration"),  # sockets and a gRPC server on loopback
    ("ranks/test_rank_group.py", "integration"),  # torch's elastic launcher, gloo rank groups
    ("ranks/test_gpu.py", "integration"),  # nccl and bf16 on a CUDA device
    ("network/test_parity.py", "integration"),  # both transports under the same faults
    ("simulation/test_option_sweep.py", "integration"),  # every enumerated option, each transport
    ("simulation/test_workers.py", "integration"),  # whole runs, serial and side by side
    ("simulation/test_overlap_quality.py", "integration"),  # six short trainings
    ("network/test_fuzz.py", "integration"),  # ten thousand streams against a live server
    ("adversarial/test_fuzz.py", "integration"),  # ten thousand mutated updates, replayed
    ("k8s/*", "integration"),  # Helm, kubectl and kubernetes-validate on rendered manifests
    ("infra/*", "integration"),  # Pulumi programs under the Pulumi mock engine, Helm
    ("compose/test_compose_files.py", "integration"),  # docker compose config
    ("image/test_image_contract.py", "integration"),  # the built image on a real engine
    ("vendor/test_online.py", "integration"),  # the package index
    ("vendor/test_import_boundary.py", "integration"),  # child interpreters, whole-package scans
)

#: Markers that never go with the unit tier: what they need is not in a quick loop.
NOT_UNIT = ("slow", "full", "docker", "kind", "netns", "online", "gpu")

#: Set to 1 to run the ``full`` tests: the full forms of suites every run has in a smaller form.
FULL_SUITES_ENV = "LENSEMBLE_FULL_SUITES"

#: Parallel workers per CPU core under ``-n auto``: most heavy tests wait on child processes,
#: sockets or sleeps, so more workers than cores keep the cores busy (docs/performance.md). The
#: unit tier alone computes in this process: one worker per core.
WORKERS_PER_CORE = 2

#: Node id -> (its tier markers, its file's default tier, its NOT_UNIT markers) for the whole
#: collection, kept before ``-m`` deselects anything (checked by ``tests/test_tiers.py``).
Collected = dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]]
COLLECTED = pytest.StashKey[Collected]()


def default_tier(path: Path) -> str:
    """The tier of a test file that names none (see :data:`TIER_BY_PATH`)."""
    try:
        relative = path.resolve().relative_to(TESTS).as_posix()
    except ValueError:  # a test outside tests/ (pytest given another path)
        return "unit"
    for pattern, tier in TIER_BY_PATH:
        if fnmatch(relative, pattern):
            return tier
    return "unit"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under exactly ``-m unit``, skip importing test files that hold no unit test."""
    if config.option.markexpr.strip() != "unit":
        return None
    is_test_file = collection_path.suffix == ".py" and collection_path.name.startswith("test_")
    if is_test_file and default_tier(collection_path) != "unit":
        return True
    return None


def full_suites() -> bool:
    """Whether this run includes the ``full`` tests (``LENSEMBLE_FULL_SUITES=1``)."""
    return os.environ.get(FULL_SUITES_ENV, "") == "1"


def pytest_configure(config: pytest.Config) -> None:
    """On a parallel worker, share the machine with the other workers (:mod:`tests.support.machine`)."""
    if hasattr(config, "workerinput") and config.option.basetemp:
        # The workers' temp folders are subfolders of the run's: the lock files go there.
        machine.open_locks(Path(config.option.basetemp).parent)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Run every test (setup, call, teardown) holding its worker's share of the machine."""
    with machine.shared():
        return (yield)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Workers of ``-n auto``: :data:`WORKERS_PER_CORE` per core this process may use."""
    cores = len(os.sched_getaffinity(0))
    return cores if config.option.markexpr.strip() == "unit" else WORKERS_PER_CORE * cores


def run_order(item: pytest.Item) -> tuple[int, int]:
    """Sort key that puts slow tests first, then e2e, integration and unit (lowest first)."""
    names = {m.name for m in item.iter_markers()}
    tier = next((i for i, t in enumerate(reversed(TIERS)) if t in names), len(TIERS))
    return (0 if "slow" in names else 1, tier)


def scope_of(item: pytest.Item) -> str:
    """What ``--dist loadscope`` hands to one worker: the test's file, or its class."""
    return item.nodeid.rsplit("::", 1)[0]


def sort_scopes(items: list[pytest.Item]) -> None:
    """Order ``items`` by the :func:`run_order` of their scope's first test, file order within."""
    first: dict[str, tuple[int, int]] = {}
    for item in items:
        scope = scope_of(item)
        first[scope] = min(first.get(scope, run_order(item)), run_order(item))
    items.sort(key=lambda item: first[scope_of(item)])


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give every test without an explicit tier its file's default tier, before ``-m`` runs.

    Also skips the ``full`` tests unless :func:`full_suites`, and on a parallel worker puts the
    files of the heaviest tests first (:func:`sort_scopes`): the scheduler hands them out in
    this order.
    """
    collected: Collected = {}
    for item in items:
        if not any(m.name in TIERS for m in item.iter_markers()):
            item.add_marker(default_tier(item.path))
        names = {m.name for m in item.iter_markers()}
        collected[item.nodeid] = (
            tuple(t for t in TIERS if t in names),
            default_tier(item.path),
            tuple(m for m in NOT_UNIT if m in names),
        )
        if "full" in names and not full_suites():
            reason = f"the full form of a suite run here in a smaller form: {FULL_SUITES_ENV}=1"
            item.add_marker(pytest.mark.skip(reason=reason))
    config.stash[COLLECTED] = collected
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: every worker sorts alike
        sort_scopes(items)


@pytest.fixture
def collected_tiers(request: pytest.FixtureRequest) -> Collected:
    """Node id -> (tiers, default tier, NOT_UNIT markers) of every test collected here."""
    return request.config.stash[COLLECTED]


@pytest.fixture
def repo() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the test with the repository root as working directory."""
    monkeypatch.chdir(REPO)
    return REPO
