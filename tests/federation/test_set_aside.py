"""Named suspects are set aside: weight 0 in the mean, in the ledger, replayed by resume and verify.

Issue 36: a participant that suspicion names (its score after the last committed round reaches
``SUSPECT_SCORE``) no longer moves the model, whatever it sends; the ledger says whom the mean
left out and with which score, a resume continues with the same decisions, and ``lensemble
verify`` refuses a line whose set-aside is not what the scores before it give.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from lensemble.config.schema import RobustnessConfig
from lensemble.federation.faults import parse_faults
from lensemble.federation.ledger import Ledger, RoundRecord, build_line, committed_chain
from lensemble.federation.set_aside import RELEASE_SCORE, set_aside
from lensemble.federation.suspicion import SUSPECT_SCORE
from lensemble.federation.verify import verify_run
from tests.support.federation import build, small_config

#: delta flips and scales its update from round 0: named after round 0, set aside from round 1.
ATTACK = "scaled:delta@0-=-9.5"


def _records(
    out: Path | None, spec: str = ATTACK, rounds: int = 4, **robustness: object
) -> list[RoundRecord]:
    config = small_config(rounds=rounds, robustness=robustness)
    coordinator, transport, _ = build(config, faults=parse_faults(spec), output_dir=out)
    return coordinator.run(transport).records


def test_a_minority_of_named_suspects_is_set_aside_with_its_scores() -> None:
    scores = {"a": 0.1, "b": SUSPECT_SCORE, "c": 2.5, "d": 0.99, "e": 0.0}
    assert set_aside(scores, ["e", "d", "c", "b", "a"]) == {"b": SUSPECT_SCORE, "c": 2.5}
    # Only the kept updates count, and an id never scored is not a suspect.
    assert set_aside(scores, ["a", "c", "new"]) == {"c": 2.5}
    assert set_aside({}, ["a", "b"]) == {}


def test_half_or_more_named_sets_nobody_aside() -> None:
    # The scores are then the majority's (the median they are judged against is theirs).
    scores = {"a": 3.0, "b": 2.0, "c": 0.1, "d": 0.2}
    assert set_aside(scores, ["a", "b", "c", "d"]) == {}
    assert set_aside(scores, ["a", "c", "d"]) == {"a": 3.0}
    assert set_aside({"a": 3.0}, ["a"]) == {}


def test_a_participant_set_aside_stays_aside_until_its_score_falls_below_half() -> None:
    kept = ["a", "b", "c", "d", "e"]
    scores = {"a": RELEASE_SCORE, "b": 0.99 * RELEASE_SCORE, "c": 0.9, "d": 0.1, "e": 0.0}
    assert set_aside(scores, kept, before=["a", "b"]) == {"a": RELEASE_SCORE}
    assert set_aside(scores, kept) == {}  # not named: 0.9 is below the threshold


def test_a_reformed_attacker_is_released_once_its_score_halves() -> None:
    # delta attacks in rounds 0 and 1, then sends honest updates: its score decays by half a
    # round; it stays aside while the score is at least RELEASE_SCORE, then is back in the mean.
    records = _records(None, spec="scaled:delta@0-1=-9.5", rounds=10)
    held, released = False, False
    for before, record in itertools.pairwise(records):
        score = before.defences["suspicion"]["delta"]  # type: ignore[index]
        was_aside = "delta" in before.defences["set_aside"]  # type: ignore[operator]
        aside = "delta" in record.defences["set_aside"]  # type: ignore[operator]
        assert aside == (score >= (RELEASE_SCORE if was_aside else SUSPECT_SCORE)), record.round
        held |= aside and score < SUSPECT_SCORE
        released |= was_aside and not aside
    assert held and released


def test_the_setting_is_on_by_default() -> None:
    assert RobustnessConfig().set_aside_suspects is True


def test_a_named_attacker_is_set_aside_from_the_round_after_it_is_named() -> None:
    records = _records(None)
    assert records[0].defences["set_aside"] == {}  # nobody is named before any history
    for before, record in itertools.pairwise(records):
        score = before.defences["suspicion"]["delta"]  # type: ignore[index]
        assert score >= SUSPECT_SCORE
        assert record.defences["set_aside"] == {"delta": score}
        assert "delta" in record.contributors  # still a contributor, screened and scored
        assert "delta" not in record.defences["below_momentum_floor"]  # type: ignore[operator]


def test_an_honest_run_sets_nobody_aside_and_commits_the_same_models() -> None:
    on = _records(None, spec="")
    off = _records(None, spec="", set_aside_suspects=False)
    assert all(r.defences["set_aside"] == {} for r in on)
    assert all("set_aside" not in r.defences for r in off)
    assert [r.model_hash for r in on] == [r.model_hash for r in off]


def test_once_named_what_the_attacker_sends_no_longer_moves_the_model() -> None:
    # From round 1 delta sends -9.5 x or +9.5 x its update: the same norm (so the same clip
    # bound for everyone else), opposite directions. Set aside, both runs commit the same
    # models; only clipped, they part at round 1.
    flip = "scaled:delta@0=-9.5,scaled:delta@1-=-9.5"
    push = "scaled:delta@0=-9.5,scaled:delta@1-=9.5"
    for setting, same in ((True, True), (False, False)):
        a = [r.model_hash for r in _records(None, flip, set_aside_suspects=setting)]
        b = [r.model_hash for r in _records(None, push, set_aside_suspects=setting)]
        assert a[0] == b[0]
        assert (a == b) is same, setting


def test_a_resume_sets_aside_whom_the_straight_run_did(tmp_path: Path) -> None:
    config = small_config(rounds=5, robustness={})
    straight = _records(tmp_path / "straight", rounds=5)
    out = tmp_path / "resumed"
    coordinator, transport, _ = build(config, faults=parse_faults(ATTACK), output_dir=out)
    for _ in range(2):
        coordinator.run_round(transport)
    resumed, transport, _ = build(config, faults=parse_faults(ATTACK), output_dir=out, resume=True)
    resumed.run(transport)
    records = [r for r in Ledger(out / "ledger.jsonl").records() if r.state == "closed"]
    assert [r.defences["set_aside"] for r in records] == [r.defences["set_aside"] for r in straight]
    assert committed_chain(Ledger(out / "ledger.jsonl").records()) == [
        r.model_hash for r in straight
    ]


def test_verify_refuses_a_set_aside_the_scores_do_not_give(tmp_path: Path) -> None:
    _records(tmp_path)
    assert verify_run(tmp_path).first_break is None
    ledger = tmp_path / "ledger.jsonl"
    lines = [json.loads(x) for x in ledger.read_text().splitlines()]
    # Forge a consistent chain of lines (no key: anyone could) that hides the set-aside of
    # round 2, sets aside an honest participant in round 1, or changes the weight's reason.
    forgeries = {
        "hidden": (2, {}),
        "honest": (1, {}),
        "score": (1, {"delta": 0.5}),
    }
    for name, (round_index, value) in forgeries.items():
        forged, prev = [], ""
        for body in lines:
            record = dict(body["record"])
            if record["round"] == round_index:
                aside = record["defences"]["set_aside"]
                if name == "honest":
                    value = {"alpha": 1.5, **aside}
                record["defences"] = {**record["defences"], "set_aside": value}
            text = build_line(body["seq"], prev, record, body["checkpoint"], None)
            prev = json.loads(text)["line_hash"]
            forged.append(text)
        ledger.write_text("\n".join(forged) + "\n")
        brk = verify_run(tmp_path).first_break
        assert brk is not None, name
        assert f"round {round_index} sets aside" in brk.sentence(), (name, brk.sentence())
