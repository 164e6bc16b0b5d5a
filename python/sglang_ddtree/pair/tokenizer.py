"""Byte-level BPE tokenizer of the shipped pair, saved as Hugging Face tokenizer files.

Training uses only the `tokenizers` library; the saved folder (``tokenizer.json``,
``tokenizer_config.json`` with a ChatML ``chat_template``, ``special_tokens_map.json``) loads offline
in SGLang and in ``transformers.AutoTokenizer``. :class:`PairTokenizer` is a thin wrapper for the
plain-PyTorch demo, so that it needs no ``transformers``.

Special tokens take the first ids, in this order:

====  =================  ==========================================================
id    token              use
====  =================  ==========================================================
0     ``<|endoftext|>``  end of a document (eos for completions, also the pad token)
1     ``<|im_start|>``   ChatML turn start
2     ``<|im_end|>``     ChatML turn end (eos for chat)
3     ``<|MASK|>``       DFlash mask token (``dflash_config.mask_token_id``); never in text
====  =================  ==========================================================
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK_TOKEN = "<|MASK|>"  # SGLang's DEFAULT_DFLASH_MASK_TOKEN, so name and id agree
SPECIAL_TOKENS = [EOS_TOKEN, IM_START, IM_END, MASK_TOKEN]
EOS_ID, IM_START_ID, IM_END_ID, MASK_ID = range(4)

# ChatML, as Qwen uses it (without tools or thinking). `apply_chat_template` below is the same in
# plain Python.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def apply_chat_template(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Render ChatML exactly as :data:`CHAT_TEMPLATE` does."""
    out = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    if add_generation_prompt:
        out += f"{IM_START}assistant\n"
    return out


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> Tokenizer:
    """Train a byte-level BPE (GPT-2 pre-tokenization regex, no prefix space) on `texts`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    return tok


def save_hf_tokenizer(tok: Tokenizer, out_dir: str | Path, model_max_length: int = 2048) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"), pretty=False)
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "mask_token": MASK_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {
        "additional_special_tokens": [IM_START, IM_END],
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "mask_token": MASK_TOKEN,
    }
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


class PairTokenizer:
    """Minimal tokenizer API for the plain-PyTorch demo (no `transformers` needed).

    ``encode(text) -> list[int]`` adds no special tokens; ``decode(ids) -> str``.
    """

    def __init__(self, path: str | Path):
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        self.tokenizer = Tokenizer.from_file(str(path))
        self.eos_token_id = EOS_ID
        self.pad_token_id = EOS_ID
        self.im_start_id = IM_START_ID
        self.im_end_id = IM_END_ID
        self.mask_token_id = MASK_ID
        self.mask_token = MASK_TOKEN
        # Generation stops at either; SGLang reads the same list from generation_config.json.
        self.stop_token_ids = [EOS_ID, IM_END_ID]

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return apply_chat_template(messages, add_generation_prompt)
