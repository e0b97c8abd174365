"""The offline tokenizer of the tiny models: a byte-level BPE trained on seeded text.

Every byte is encodable, so any prompt works; the training text is generated here, so
nothing is downloaded. Same seed, same tokenizer files.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from afd_models.tiny.specs import EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, VOCAB_SIZE

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

_VOCABULARY = (
    "attention ffn expert router gate token hidden state layer decoder residual norm "
    "rank world stage step prefill decode batch cache block scheduler sampler logits "
    "send receive connector gloo nccl tensor shape dtype server client request reply "
    "the a an of to in on for with from and or not is are was be has have this that "
    "hello world paris france capital city river mountain north south east west "
    "one two three four five six seven eight nine ten hundred every each some many "
    "quick brown fox jumps over lazy dog red green blue small large fast slow"
)

# A minimal ChatML-style template so the chat endpoint works too.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def training_text(seed: int) -> list[str]:
    """Deterministic English-like lines (and some digits) to train the BPE merges on."""
    rng = random.Random(seed)
    words = _VOCABULARY.split()
    lines = [
        " ".join(rng.choice(words) for _ in range(rng.randint(4, 15))) + "." for _ in range(3000)
    ]
    lines += [f"Step {i} sent {i * 7} tokens to rank {i % 4}, didn't it?" for i in range(200)]
    return lines


def build_tokenizer(seed: int) -> PreTrainedTokenizerFast:
    """Train the tokenizer; it has at most ``VOCAB_SIZE`` tokens, specials first."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(training_text(seed), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=512,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
