"""One logging setup for every role: JSON lines off a terminal, text on one."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from lensemble.config import LensembleConfig
from lensemble.network.shared import logs
from tests.support.federation import small_config


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger(logs.ROOT_LOGGER)
    saved = (root.handlers[:], root.level, root.propagate)
    yield
    root.handlers[:], root.level, root.propagate = saved


@pytest.fixture
def config() -> LensembleConfig:
    return small_config()


def _configure(
    monkeypatch: pytest.MonkeyPatch, stream: io.StringIO, config: LensembleConfig, fmt: str
) -> None:
    monkeypatch.setattr(sys, "stderr", stream)
    patched = config.model_copy(
        update={"observability": config.observability.model_copy(update={"log_format": fmt})}
    )
    logs.configure(patched, "participant", "alpine")


def test_auto_writes_json_lines_with_run_round_attempt_and_participant(
    monkeypatch: pytest.MonkeyPatch, config: LensembleConfig
) -> None:
    stream = io.StringIO()
    _configure(monkeypatch, stream, config, "auto")
    logger = logging.getLogger("lensemble.test")
    logs.event(logger, "trained", "trained round 3", round=3, attempt=1, compute_s=0.5)
    logger.warning("plain %s", "line")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["event"] == "trained" and first["message"] == "trained round 3"
    assert (first["round"], first["attempt"], first["participant"]) == (3, 1, "alpine")
    assert (first["role"], first["run_id"], first["level"]) == (
        "participant",
        config.run.name,
        "INFO",
    )
    assert first["ts"].endswith("Z") and "fields" not in first
    assert second["message"] == "plain line" and "event" not in second


def test_auto_writes_text_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, config: LensembleConfig
) -> None:
    stream = _Terminal()
    _configure(monkeypatch, stream, config, "auto")
    logs.event(logging.getLogger("lensemble.test"), "trained", "trained round 3", round=3)
    line = stream.getvalue().strip()
    assert line.endswith("INFO [alpine] trained round 3")
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def test_json_is_forced_even_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, config: LensembleConfig
) -> None:
    stream = _Terminal()
    _configure(monkeypatch, stream, config, "json")
    logging.getLogger("lensemble.test").info("hello")
    assert json.loads(stream.getvalue())["message"] == "hello"
