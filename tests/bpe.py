"""A small byte-level BPE tokenizer with a ChatML template, trained locally in seconds (nothing downloaded).

Like the real engine's tiny model (../shared/real-engine/build_tiny_model.py): byte-level BPE over
Python's own sources, so common English words cost one to three tokens, plus `<|im_start|>` /
`<|im_end|>` specials and a ChatML chat template in `tokenizer_config.json`.
"""

from __future__ import annotations

import glob
import json
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] is not none %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}"
    "{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _corpus(max_bytes: int) -> Iterator[str]:
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    total = 0
    for name in files:
        if total >= max_bytes:
            return
        text = Path(name).read_text(encoding="utf-8", errors="ignore")
        total += len(text)
        for i in range(0, len(text), 4096):
            yield text[i : i + 4096]


def build(directory: Path, vocab_size: int = 4096, max_bytes: int = 3_000_000) -> Path:
    """Train and save tokenizer.json + tokenizer_config.json into `directory`; returns tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(max_bytes), trainer=trainer)
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    tokenizer.save(str(path))
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHATML}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path
