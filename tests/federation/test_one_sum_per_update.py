"""A hostile coordinator cannot put one update into two unmasked sums by retrying a round.

A retry trains the same update (same model, same batches): two sums of it with different
partners would expose it exactly (the difference of a sum with the victim and one without). So a
participant that signed a survivor set of a round takes part in no later attempt of it; with
one group no second session can then reach t signers (t > n / 2), and with several groups every
survivor must sign before anything is revealed (docs/security.md, *one sum per update*).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lensemble.config import LensembleConfig
from lensemble.errors import QuorumNotReached
from lensemble.federation.masked_round import retry_possible, signed_earlier
from lensemble.federation.masking import SessionKey, session_contexts
from lensemble.federation.masking_client import MaskingClient, SignedRounds
from lensemble.federation.payload import manifest
from lensemble.federation.secagg.context import SessionContext
from lensemble.federation.secagg.driver import drive
from lensemble.federation.secagg.errors import Reason, SecAggAbort
from lensemble.federation.secagg.groups import assign_groups
from lensemble.federation.secagg.identity import simulation_identity
from lensemble.federation.secagg.keys import simulation_seed
from lensemble.federation.secagg.messages import UnmaskRequest
from lensemble.federation.secagg.server import SecureSum, ServerSession, Stage
from lensemble.federation.signed_rounds import record_path
from tests.federation.test_masked_regrouping import NINE, SEED
from tests.federation.test_masked_regrouping import _config as nine_config
from tests.support.federation import build, initial_params, small_config

VICTIM = "alpha"
EIGHT = [{"id": f"site-{i}"} for i in range(8)]


def _clients(
    config: LensembleConfig, signed: Mapping[str, SignedRounds] | None = None
) -> dict[str, MaskingClient]:
    keys = {p: simulation_identity(3, p) for p in config.participant_ids}
    verifiers = {p: k.public_key() for p, k in keys.items()}
    arch = manifest(initial_params())
    return {
        p: MaskingClient(
            config,
            p,
            seed=simulation_seed(3, p),
            identity_key=keys[p],
            verifiers=verifiers,
            architecture=arch,
            signed=signed[p] if signed is not None else None,
        )
        for p in config.participant_ids
    }


class _WithheldSurvivorSet(ServerSession):
    """A hostile coordinator's session: it asks for shares once t survivors signed.

    It never shows the survivor set to the victim, so the victim does not know its input is
    unmasked (and, unprotected, would mask it again in a retry).
    """

    def close_consistency(self) -> UnmaskRequest:
        self._u4 = tuple(sorted(self._signatures))
        self._stage = Stage.UNMASK
        dropped = tuple(p for p in self._u2 if p not in self._u3)
        signatures = tuple((p, self._signatures[p]) for p in self._u4)
        return UnmaskRequest(self._digest, self._u3, dropped, signatures)


def _session(
    ctx: SessionContext,
    clients: Mapping[str, MaskingClient],
    *,
    leave_out: str | None = None,
    withhold_from: str | None = None,
) -> SecureSum:
    """Drive one session; ``leave_out`` gets no message, ``withhold_from`` none from consistency."""
    key = SessionKey(ctx.round, ctx.attempt, ctx.group)
    verifiers = {p: clients[p].identity_key.public_key() for p in ctx.roster}
    server = (_WithheldSurvivorSet if withhold_from else ServerSession)(ctx, verifiers)

    def exchange(stage: str, outgoing: Mapping[str, bytes]) -> Iterator[tuple[str, bytes]]:
        for pid, data in outgoing.items():
            late = stage in ("consistency", "unmask") and pid == withhold_from
            if pid == leave_out or late:
                continue
            answer = clients[pid].answer(key, stage, data)
            if answer is not None:
                yield pid, answer

    return drive(server, exchange)


def _hold(clients: Mapping[str, MaskingClient], attempt: int, d: int) -> dict[str, np.ndarray]:
    """Every participant holds its update of round 0 (the same in every attempt, as retrained)."""
    rng = np.random.default_rng(0)
    updates = {p: (rng.standard_normal(d) * 0.01).astype(np.float32) for p in sorted(clients)}
    for pid, client in clients.items():
        client.hold(0, attempt, updates[pid])
    return updates


def _encoded(ctx: SessionContext, update: np.ndarray) -> np.ndarray:
    words = np.empty(ctx.dimension, dtype=np.uint64)
    ctx.codec.encode_into(update, words)
    return words


def _first_attempt(
    config: LensembleConfig, clients: Mapping[str, MaskingClient], **options: str | None
) -> tuple[SecureSum, SessionContext]:
    """Round 0's attempt 0 with every participant (``options``: :func:`_session`'s), and the
    context of the attempt 1 a coordinator would rerun it as (one group)."""
    arch = manifest(initial_params())
    (ctx0,) = session_contexts(config, 0, 0, arch)
    _hold(clients, 0, ctx0.dimension)
    first = _session(ctx0, clients, **options)
    (ctx1,) = session_contexts(config, 0, 1, arch)
    return first, ctx1


def test_a_rerun_without_the_victim_would_expose_its_update_and_is_refused() -> None:
    config = small_config(aggregation="masking")
    clients = _clients(config)
    whole, ctx1 = _first_attempt(config, clients)
    assert whole.survivors == tuple(sorted(config.participant_ids))
    # The coordinator says attempt 0 failed and reruns the round without the victim.
    # Participants that forgot what they signed (the attack as it stood): the difference of
    # the two sums is the victim's update, exactly.
    forgetful = _clients(config)
    updates = _hold(forgetful, 1, ctx1.dimension)  # the same updates as attempt 0's
    rest = _session(ctx1, forgetful, leave_out=VICTIM)
    assert np.array_equal(whole.total - rest.total, _encoded(ctx1, updates[VICTIM]))
    # The participants themselves: each signed attempt 0's survivor set, so none masks again.
    _hold(clients, 1, ctx1.dimension)
    with pytest.raises(SecAggAbort) as caught:
        _session(ctx1, clients, leave_out=VICTIM)
    assert caught.value.reason is Reason.BELOW_THRESHOLD and caught.value.stage == "advertise"
    for pid in sorted(set(clients) - {VICTIM}):
        assert [r.reason for r in clients[pid].refusals] == [Reason.ROUND_ALREADY_SIGNED]


def test_a_new_client_for_each_attempt_remembers_through_the_shared_record() -> None:
    # Over the network each attempt gets a client of its own (its peers' keys come with the
    # attempt); the record of what the participant signed is the process's, shared by them.
    config = small_config(aggregation="masking")
    first = _clients(config)
    _, ctx1 = _first_attempt(config, first)
    again = _clients(config, signed={p: c.signed for p, c in first.items()})
    _hold(again, 1, ctx1.dimension)
    with pytest.raises(SecAggAbort):
        _session(ctx1, again, leave_out=VICTIM)
    refusals = [again[p].refusals for p in sorted(set(again) - {VICTIM})]
    assert all([r.reason for r in refused] == [Reason.ROUND_ALREADY_SIGNED] for refused in refusals)
    # The next round is a new one: everyone masks again.
    (next_round,) = session_contexts(config, 1, 0, manifest(initial_params()))
    for client in again.values():
        client.hold(1, 0, np.zeros(next_round.dimension, dtype=np.float32))
    assert _session(next_round, again).survivors == tuple(sorted(config.participant_ids))


def test_a_restarted_participant_still_refuses_the_round_it_signed(tmp_path: Path) -> None:
    # The record is written to the participant's state folder before its signature leaves, so
    # a process restarted between the attempts reads it back and still masks nothing.
    config = small_config(aggregation="masking")
    files = {p: record_path(tmp_path / p / "state") for p in config.participant_ids}
    first = _clients(config, signed={p: SignedRounds(files[p]) for p in files})
    _, ctx1 = _first_attempt(config, first)
    restarted = _clients(config, signed={p: SignedRounds(files[p]) for p in files})
    _hold(restarted, 1, ctx1.dimension)
    with pytest.raises(SecAggAbort):
        _session(ctx1, restarted, leave_out=VICTIM)
    for pid in sorted(set(restarted) - {VICTIM}):
        (refusal,) = restarted[pid].refusals
        assert refusal.reason is Reason.ROUND_ALREADY_SIGNED
        assert str(files[pid]) in refusal.remediation


def test_a_participant_keeps_its_record_beside_its_inner_state(tmp_path: Path) -> None:
    config = small_config(aggregation="masking")
    _, transport, participants = build(config, output_dir=tmp_path)
    for pid, participant in participants.items():
        assert participant.states is not None
        assert participant.masking_record == participant.states.folder / "masking-signed.json"
        assert transport._masking[pid].signed.path == participant.masking_record


def test_with_one_group_a_hidden_unmasking_leaves_too_few_for_a_second_sum() -> None:
    # t = 3 of 4: the coordinator unmasks attempt 0 with the three others' signatures, hiding
    # the survivor set from the victim, who did not sign and so would mask again. But the three
    # signed, and one participant cannot reach t in any later attempt of the round.
    config = small_config(aggregation="masking")
    clients = _clients(config)
    hidden, ctx1 = _first_attempt(config, clients, withhold_from=VICTIM)
    assert VICTIM in hidden.survivors and VICTIM not in hidden.signed
    _hold(clients, 1, ctx1.dimension)
    with pytest.raises(SecAggAbort) as caught:
        _session(ctx1, clients)
    assert caught.value.reason is Reason.BELOW_THRESHOLD
    assert caught.value.participants == (VICTIM,)


def test_with_several_groups_nothing_is_revealed_unless_every_survivor_signed() -> None:
    # Groups of 4 (t = 3): a retry regroups, so a victim hidden from the survivor set could be
    # summed again with new partners. Every survivor must sign: the others refuse to reveal.
    config = small_config(
        aggregation="masking", participants=EIGHT, quorum=6, masking={"group_size": 4}
    )
    arch = manifest(initial_params())
    clients = _clients(config)
    contexts = session_contexts(config, 0, 0, arch)
    assert len(contexts) == 2 and all(c.every_signs and c.threshold == 3 for c in contexts)
    ctx = contexts[0]
    victim = ctx.roster[0]
    _hold(clients, 0, ctx.dimension)
    with pytest.raises(SecAggAbort) as caught:
        _session(ctx, clients, withhold_from=victim)
    assert caught.value.stage == "unmask" and caught.value.reason is Reason.BELOW_THRESHOLD
    for pid in ctx.roster[1:]:
        refused = [r for r in clients[pid].refusals if r.reason is Reason.UNSIGNED_SURVIVOR]
        assert len(refused) == 1 and refused[0].participant == victim
    # The honest coordinator's session refuses to go on without every signature.
    honest = _clients(config)
    _hold(honest, 0, ctx.dimension)
    key = SessionKey(0, 0, ctx.group)
    verifiers = {p: honest[p].identity_key.public_key() for p in ctx.roster}
    server = ServerSession(ctx, verifiers)

    def exchange(stage: str, outgoing: Mapping[str, bytes]) -> Iterator[tuple[str, bytes]]:
        for pid, data in outgoing.items():
            answer = honest[pid].answer(key, stage, data)
            if answer is not None and not (stage == "consistency" and pid == victim):
                yield pid, answer

    with pytest.raises(SecAggAbort) as unsigned:
        drive(server, exchange)
    assert unsigned.value.reason is Reason.UNSIGNED_SURVIVOR
    assert unsigned.value.participants == (victim,)


def _silent_at_unmask(transport: Any, round_index: int, who: tuple[str, ...]) -> None:
    """``who`` sign round ``round_index``'s survivor set, then never answer ``unmask``."""
    exchange = transport.exchange

    def filtered(stage: str, outgoing: Mapping[str, Any]) -> Iterator[tuple[str, bytes]]:
        for pid, answer in exchange(stage, outgoing):
            session = outgoing[pid][0]
            if not (stage == "unmask" and session.round_index == round_index and pid in who):
                yield pid, answer

    transport.exchange = filtered


def test_a_group_lost_after_signing_is_recorded_and_its_signers_sit_out_the_round() -> None:
    # Nine in groups of 3, quorum 5. One member of one group signs and then goes silent: that
    # group cannot unmask, the two others commit the round with six survivors, and the ledger
    # names who signed in the lost group (they would sit out any retry of the round).
    config = nine_config()
    silent = (assign_groups(NINE, 3, SEED, 1).groups[0][0],)
    coordinator, transport, _ = build(config)
    _silent_at_unmask(transport, 1, silent)
    record = next(r for r in coordinator.run(transport).records if r.round == 1)
    assert record.state == "closed" and len(record.contributors) == 6
    (lost,) = [g for g in record.defences["masking"]["groups"] if "aborted" in g]
    assert lost["aborted"] == "below_threshold" and lost["stage"] == "unmask"
    assert sorted(lost["signed"]) == sorted(lost["roster"])
    assert signed_earlier([record], 1) >= set(lost["roster"])
    assert not retry_possible(config, [record], 1)  # nine signed: no retry could commit


def test_a_round_lost_after_signing_is_not_retried_and_says_why() -> None:
    # Two groups lose a member after signing: three survivors, below quorum. Every one of the
    # nine signed a survivor set, so a retry would put updates into second sums: the run stops,
    # naming the reason, instead of retrying.
    config = nine_config()
    groups = assign_groups(NINE, 3, SEED, 1).groups
    coordinator, transport, _ = build(config)
    _silent_at_unmask(transport, 1, (groups[0][0], groups[1][0]))
    with pytest.raises(QuorumNotReached, match="not retried: under masking"):
        coordinator.run(transport)
    attempts = [r for r in coordinator.history if r.round == 1]
    assert [r.attempt for r in attempts] == [0]


def test_who_signed_a_session_that_then_aborted_is_known_to_the_coordinator() -> None:
    # With several groups a survivor that does not sign aborts its session at the consistency
    # stage; the others did sign (and sit out the round's retries): the session names them.
    config = small_config(
        aggregation="masking", participants=EIGHT, quorum=6, masking={"group_size": 4}
    )
    clients = _clients(config)
    ctx = session_contexts(config, 0, 0, manifest(initial_params()))[0]
    _hold(clients, 0, ctx.dimension)
    key = SessionKey(0, 0, ctx.group)
    silent = ctx.roster[0]
    server = ServerSession(ctx, {p: clients[p].identity_key.public_key() for p in ctx.roster})

    def exchange(stage: str, outgoing: Mapping[str, bytes]) -> Iterator[tuple[str, bytes]]:
        for pid, data in outgoing.items():
            if not (stage == "consistency" and pid == silent):
                answer = clients[pid].answer(key, stage, data)
                if answer is not None:
                    yield pid, answer

    with pytest.raises(SecAggAbort):
        drive(server, exchange)
    assert server.signers == ctx.roster[1:]


def test_going_back_to_an_earlier_round_is_refused() -> None:
    # A coordinator that reopens an earlier round index after a later round was signed would
    # have every participant retrain a round it already trained (the same batches, from a model
    # of the coordinator's choosing) and sum it again without the victim.
    config = small_config(aggregation="masking")
    clients = _clients(config)
    arch = manifest(initial_params())
    (later,) = session_contexts(config, 1, 0, arch)
    for client in clients.values():
        client.hold(1, 0, np.zeros(later.dimension, dtype=np.float32))
    assert _session(later, clients).survivors == tuple(sorted(config.participant_ids))
    (earlier,) = session_contexts(config, 0, 0, arch)
    _hold(clients, 0, earlier.dimension)
    with pytest.raises(SecAggAbort) as caught:
        _session(earlier, clients, leave_out=VICTIM)
    assert caught.value.reason is Reason.BELOW_THRESHOLD and caught.value.stage == "advertise"
    for pid in sorted(set(clients) - {VICTIM}):
        (refusal,) = clients[pid].refusals
        assert refusal.reason is Reason.ROUND_ALREADY_SIGNED
        assert "round 0 is not after it" in str(refusal)
    # The round after the signed one is new: everyone masks in it.
    (after,) = session_contexts(config, 2, 0, arch)
    for client in clients.values():
        client.hold(2, 0, np.zeros(after.dimension, dtype=np.float32))
    assert _session(after, clients).survivors == tuple(sorted(config.participant_ids))
