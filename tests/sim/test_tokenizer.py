from hypothesis import given
from hypothesis import strategies as st

from replayproxy.sim import tokenizer as tk


def test_words_and_punctuation_are_tokens_and_whitespace_is_not() -> None:
    ids = tk.encode("Hello, world!  the  end.")
    assert len(ids) == 7
    assert ids[2] == tk.VOCAB.index("world") and ids[3] == tk.VOCAB.index("!")


def test_unknown_words_get_stable_ids_outside_the_fixed_vocabulary() -> None:
    a, b, c = tk.encode("zyzzyva zyzzyva quokka")
    assert a == b == tk.encode("zyzzyva")[0] != c
    assert len(tk.VOCAB) <= a < tk.VOCAB_SIZE


@given(st.lists(st.sampled_from(tk.GENERATED_IDS), min_size=1, max_size=200))
def test_generated_text_retokenizes_to_the_same_tokens(ids: list[int]) -> None:
    assert tk.encode(tk.decode(ids)) == ids


def test_chat_template_overhead_is_as_documented() -> None:
    messages = [("system", "Be brief."), ("user", "What is a prefix cache?")]
    ids = tk.render_chat(messages)
    content = sum(len(tk.encode(text)) for _, text in messages)
    assert len(ids) == tk.CHAT_FIXED_OVERHEAD + len(messages) * tk.CHAT_PER_MESSAGE_OVERHEAD + content
    assert ids[0] == tk.BOS_ID and ids[-1] == tk.END_HEADER_ID
