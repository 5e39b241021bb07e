"""Prompt synthesis: determinism, words keyed by hash chains, and message layouts that share spans."""

from __future__ import annotations

import numpy as np

from replayproxy.replay import synth

CHAIN_A = np.array([11, 12, 13, 14], np.uint64)
CHAIN_B = np.array([11, 12, 99], np.uint64)  # agrees with A for two blocks


def test_words_are_deterministic_and_keyed_by_seed() -> None:
    words = synth.Words(seed=7, block_tokens=4)
    first = words.codes(0, CHAIN_A, 0, 20)
    assert np.array_equal(first, synth.Words(seed=7, block_tokens=4).codes(0, CHAIN_A, 0, 20))
    assert not np.array_equal(first, synth.Words(seed=8, block_tokens=4).codes(0, CHAIN_A, 0, 20))


def test_shared_blocks_give_shared_words_and_differ_after() -> None:
    words = synth.Words(seed=1, block_tokens=4)
    a = words.codes(0, CHAIN_A, 0, 16)
    b = words.codes(1, CHAIN_B, 0, 16)
    assert np.array_equal(a[:8], b[:8])  # two shared blocks of four
    assert not np.array_equal(a[8:12], b[8:12])
    assert not np.array_equal(a[12:], b[12:])


def test_tails_differ_between_requests_with_the_same_chain() -> None:
    words = synth.Words(seed=1, block_tokens=4)
    a = words.codes(0, CHAIN_A, 0, 24)
    b = words.codes(5, CHAIN_A, 0, 24)
    assert np.array_equal(a[:16], b[:16])
    assert not np.array_equal(a[16:], b[16:])


def test_text_and_token_ids() -> None:
    words = synth.Words(seed=3, block_tokens=16)
    text = words.words(0, CHAIN_A, 0, 50)
    assert len(text.split()) == 50 and set(text.split()) <= set(synth.VOCAB)
    ids = words.token_ids(0, CHAIN_A, 300)
    assert len(ids) == 300 and synth.TOKEN_ID_LOW <= min(ids) and max(ids) < synth.TOKEN_ID_HIGH


def test_vocabulary_is_plain_distinct_words() -> None:
    assert len(set(synth.VOCAB)) == len(synth.VOCAB) >= 256
    assert all(w.isalpha() and w.isascii() for w in synth.VOCAB)


def test_fresh_layout_splits_content_evenly() -> None:
    plan = synth.layout(100, ("system", "user"), overhead=12, gap=4, shared=0, donor=None)
    assert plan.messages == (("system", 44), ("user", 44))
    assert [s[1] for s in plan.spans()] == [0, 48]


def test_layout_copies_a_message_that_straddles_the_shared_span() -> None:
    donor = synth.layout(200, ("system", "user"), 12, 4, 0, None)  # system 94, user 94
    plan = synth.layout(300, ("system", "user"), 12, 4, shared=64, donor=donor)
    assert plan.messages[0][0] == "system" and plan.messages[0][1] >= 64
    assert sum(t for _, t in plan.messages) == 300 - 12


def test_layout_keeps_closed_messages_of_the_donor() -> None:
    donor = synth.Layout((("system", 20), ("user", 30)), 4)
    roles = ("system", "user", "assistant", "user")
    plan = synth.layout(200, roles, 20, 4, shared=56, donor=donor)
    assert plan.messages[:2] == (("system", 20), ("user", 30))  # both contents end before position 56
    assert sum(t for _, t in plan.messages) == 180
    grown = synth.layout(200, roles, 20, 4, shared=48, donor=donor)  # the user message straddles 48
    assert grown.messages[0] == ("system", 20) and grown.messages[1][1] >= 24
    assert sum(t for _, t in grown.messages) == 180


def test_layout_without_room_for_the_donor_span_does_not_share() -> None:
    donor = synth.Layout((("user", 100),), 4)
    plan = synth.layout(40, ("user",), 8, 4, shared=64, donor=donor)
    assert plan.messages == (("user", 32),)


def test_first_owners_and_shared_blocks() -> None:
    hashes = np.array([1, 2, 3, 1, 2, 9, 1, 7], np.uint64)
    index = np.array([0, 3, 6, 8], np.int64)
    owners = synth.first_owners(hashes, index)
    assert owners.tolist() == [0, 0, 0, 0, 0, 1, 0, 2]
    assert [synth.shared_blocks(owners, index, r) for r in range(3)] == [0, 2, 1]


def test_chat_roles_and_template() -> None:
    assert synth.chat_roles("suat") == ("system", "user", "assistant", "user")
    assert synth.chat_roles("") == ("user",)
    template = synth.Template(4, 4, 1.0, {"user+tools": 50})
    assert template.overhead("system,user", 2) == 12
    assert template.overhead("user+tools", 1) == 50
    assert synth.template_key(("user",), True) == "user+tools"
