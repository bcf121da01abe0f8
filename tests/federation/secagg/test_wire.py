"""Every message round-trips through its encoding, and any mangled bytes are a classified refusal."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lensemble.federation.secagg.errors import Reason, SecAggRefusal
from lensemble.federation.secagg.messages import (
    ConsistencySignature,
    EncryptedShares,
    KeyAdvert,
    KeyRoster,
    MaskedInput,
    ShareDelivery,
    SurvivorSet,
    UnmaskRequest,
    UnmaskShares,
)
from lensemble.federation.secagg.wire import Writer
from tests.federation.secagg.helpers import Recorder, context, run, updates

DECODERS = {
    cls.KIND: cls.decode
    for cls in (
        KeyAdvert,
        KeyRoster,
        EncryptedShares,
        ShareDelivery,
        MaskedInput,
        SurvivorSet,
        ConsistencySignature,
        UnmaskRequest,
        UnmaskShares,
    )
}


def _messages() -> list[bytes]:
    ctx = context(5, 12)
    recorder = Recorder()
    run(ctx, updates(ctx.roster, 12), recorder=recorder)
    return [data for *_, data in recorder.log]


MESSAGES = _messages()


def test_every_kind_of_message_was_sent_and_round_trips() -> None:
    kinds = {data[4] for data in MESSAGES}
    assert kinds == set(DECODERS)
    for data in MESSAGES:
        message = DECODERS[data[4]](data)
        assert message.encode() == data


@settings(max_examples=300, deadline=None)
@given(
    index=st.integers(0, len(MESSAGES) - 1),
    seed=st.integers(0, 2**32),
    mode=st.sampled_from(["truncate", "flip", "insert", "splice"]),
)
def test_mangled_bytes_decode_or_are_refused_as_bad_message(
    index: int, seed: int, mode: str
) -> None:
    data = bytearray(MESSAGES[index])
    rng = random.Random(seed)
    position = rng.randrange(len(data))
    if mode == "truncate":
        data = data[:position]
    elif mode == "flip":
        data[position] ^= 1 << rng.randrange(8)
    elif mode == "insert":
        data[position:position] = rng.randbytes(rng.randrange(1, 9))
    else:
        data[position : position + 4] = rng.choice(
            [b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f\xff\xff\xf0"]
        )
    decode = DECODERS[MESSAGES[index][4]]
    try:
        decode(bytes(data))
    except SecAggRefusal as refusal:
        assert refusal.reason is Reason.BAD_MESSAGE
        assert "malformed" in str(refusal)


def test_lists_out_of_order_or_with_duplicates_are_refused() -> None:
    digest = bytes(32)
    for survivors in (("b", "a"), ("a", "a")):
        data = (
            Writer(SurvivorSet.KIND)
            .blob(digest)
            .u32(2)
            .text(survivors[0])
            .text(survivors[1])
            .finish()
        )
        with pytest.raises(SecAggRefusal, match="not sorted"):
            SurvivorSet.decode(data)


def test_lengths_beyond_their_bound_are_refused_before_reading() -> None:
    data = Writer(SurvivorSet.KIND).blob(bytes(32)).u32(10**6).finish()
    with pytest.raises(SecAggRefusal, match="above 1024"):
        SurvivorSet.decode(data)
    data = Writer(KeyAdvert.KIND).blob(bytes(33)).finish()
    with pytest.raises(SecAggRefusal, match="context"):
        KeyAdvert.decode(data)


def test_ids_must_be_printable_text() -> None:
    for bad in (b"\xff\xfe", b"a\nb", b""):
        data = Writer(SurvivorSet.KIND).blob(bytes(32)).u32(1).blob(bad).finish()
        with pytest.raises(SecAggRefusal) as caught:
            SurvivorSet.decode(data)
        assert caught.value.reason is Reason.BAD_MESSAGE


def test_a_masked_vector_must_be_whole_words() -> None:
    data = Writer(MaskedInput.KIND).blob(bytes(32)).text("a").blob(b"\x00" * 12).finish()
    with pytest.raises(SecAggRefusal, match="whole number of words"):
        MaskedInput.decode(data)
