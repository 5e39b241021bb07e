"""A deterministic toy tokenizer and chat template, so the sim's token counts are well-defined.

Text splits into words (`\\w+`) and single punctuation characters; whitespace is not a token. The
fixed vocabulary below owns ids 0..len(VOCAB)-1; any other word maps by a stable hash into the rest
of the `VOCAB_SIZE` id space. Generated text only uses vocabulary words, and re-tokenizing any
generated text gives back exactly the tokens that produced it. docs/sim.md has the full definition.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Sequence

VOCAB_SIZE = 32000
BOS = "<|begin_of_text|>"
START_HEADER = "<|start_header_id|>"
END_HEADER = "<|end_header_id|>"
EOT = "<|eot_id|>"
SPECIALS = (BOS, START_HEADER, END_HEADER, EOT)
PUNCTUATION = tuple(".,;:!?'\"()-")
WORDS = tuple(
    """
    the of and to a in is it you that he was for on are with as I his they be at one have this from
    or had by hot word but what some we can out other were all there when up use your how said an
    each she which do their time if will way about many then them write would like so these her long
    make thing see him two has look more day could go come did number sound no most people my over
    know water than call first who may down side been now find any new work part take get place made
    live where after back little only round man year came show every good me give our under name
    very through just form sentence great think say help low line differ turn cause much mean before
    move right boy old too same tell does set three want air well also play small end put home read
    hand port large spell add even land here must big high such follow act why ask men change went
    light kind off need house picture try us again animal point mother world near build self earth
    father head stand own page should country found answer school grow study still learn plant cover
    food sun four between state keep eye never last let thought city tree cross farm hard start might
    story saw far sea draw left late run while press close night real life few north open seem together
    next white children begin got walk example ease paper group always music those both mark often
    letter until mile river car feet care second book carry took science eat room friend began idea
    fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl usual
    young ready above ever red list though feel talk bird soon body dog family direct pose leave song
    measure door product black short numeral class wind question happen complete ship area half rock
    order fire south problem piece told knew pass since top whole king space heard best hour better
    true during hundred five remember step early hold west ground interest reach fast verb sing listen
    six table travel less morning ten simple several vowel toward war lay against pattern slow center
    love person money serve appear road map rain rule govern pull cold notice voice unit power town
    fine certain fly fall lead cry dark machine note wait plan figure star box noun field rest correct
    able pound done beauty drive stood contain front teach week final gave green quick develop ocean
    warm free minute strong special mind behind clear tail produce fact street inch multiply nothing
    course stay wheel full force blue object decide surface deep moon island foot system busy test
    record boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape
    """.split()
)
ROLES = ("system", "user", "assistant", "tool", "developer")
VOCAB: tuple[str, ...] = SPECIALS + PUNCTUATION + tuple(dict.fromkeys(WORDS + ROLES))
_IDS = {token: i for i, token in enumerate(VOCAB)}
_SPLIT = re.compile(r"\w+|[^\w\s]")
FIRST_WORD_ID = len(SPECIALS) + len(PUNCTUATION)
GENERATED_IDS = range(FIRST_WORD_ID, FIRST_WORD_ID + len(dict.fromkeys(WORDS)))
BOS_ID, START_HEADER_ID, END_HEADER_ID, EOT_ID = (_IDS[s] for s in SPECIALS)
# Tokens the chat template adds: BOS and the assistant header, then per message its header and EOT.
CHAT_FIXED_OVERHEAD = 4
CHAT_PER_MESSAGE_OVERHEAD = 4


@functools.lru_cache(maxsize=65536)
def _unknown_id(word: str) -> int:
    digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
    return len(VOCAB) + int.from_bytes(digest, "little") % (VOCAB_SIZE - len(VOCAB))


def encode(text: str) -> list[int]:
    """Token ids of plain text (no special tokens are recognised inside user text)."""
    ids = _IDS
    return [ids[t] if t in ids else _unknown_id(t) for t in _SPLIT.findall(text)]


def piece(token_id: int) -> str:
    """Text of one generated token: words carry a leading space, punctuation does not."""
    token = VOCAB[token_id]
    return token if token_id < FIRST_WORD_ID else " " + token


def decode(token_ids: Iterable[int]) -> str:
    """Text of generated (vocabulary) tokens."""
    return "".join(piece(i) for i in token_ids)


def render_chat(messages: Sequence[tuple[str, str]]) -> list[int]:
    """Token ids of a Llama-3-style prompt for (role, content) pairs, ending with the assistant header.

    prompt_tokens = CHAT_FIXED_OVERHEAD + sum(CHAT_PER_MESSAGE_OVERHEAD + len(encode(content))).
    """
    ids = [BOS_ID]
    for role, content in messages:
        ids += (START_HEADER_ID, _IDS[role], END_HEADER_ID)
        ids += encode(content)
        ids.append(EOT_ID)
    ids += (START_HEADER_ID, _IDS["assistant"], END_HEADER_ID)
    return ids
