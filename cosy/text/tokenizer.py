"""The CosyVoice text tokenizer: Qwen2 byte-level BPE plus the model family's CosyVoice special tokens.

Built with the `tokenizers` library directly (never `transformers`, whose model imports break beside a
CPU torch). A `CosyVoice-BlankEN` directory holds `vocab.json` + `merges.txt` + `tokenizer_config.json`
(the official layout; the BPE is assembled the way transformers' Qwen2 converter does it) or a
`tokenizer.json`. The family's CosyVoice tokens (`cosy.text.specials`) are then appended in the official
order, so `<|endofprompt|>` is 151646 and the length is 151663 (CosyVoice2) or 151924 (CosyVoice3, with
`<|endofsystem|>` and 260 phoneme tokens) for the real vocabulary. No BOS/EOS is added when encoding.

Thread safety: encode/decode only read the tokenizer; one instance may serve concurrent requests.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

from cosy.text.specials import COSYVOICE2

__all__ = ["SPECIAL_TOKENS", "ENDOFPROMPT_ID", "EOS_ID", "TextTokenizer", "TokenizerDirError"]

# CosyVoice2's, appended after the Qwen2 base specials (<|endoftext|> <|im_start|> <|im_end|>), in this order.
SPECIAL_TOKENS: tuple[str, ...] = COSYVOICE2
ENDOFPROMPT_ID = 151646
EOS_ID = 151643

# The pre-tokenizer regex of Qwen2 (transformers' Qwen2Converter / Qwen2Tokenizer).
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)
VOCAB, MERGES, CONFIG, TOKENIZER_JSON = "vocab.json", "merges.txt", "tokenizer_config.json", "tokenizer.json"


class TokenizerDirError(ValueError):
    """A tokenizer directory lacks a file or its files disagree."""


def _qwen2_bpe(vocab: Path, merges: Path) -> Tokenizer:
    """The Qwen2 fast tokenizer as transformers converts it from vocab.json + merges.txt."""
    model = BPE.from_file(str(vocab), str(merges), dropout=None, unk_token=None, continuing_subword_prefix="",
                          end_of_word_suffix="", fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(model)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        # The regex above already split the text, so ByteLevel only maps bytes to symbols.
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _add_config_tokens(tok: Tokenizer, config: Path) -> None:
    """Add tokenizer_config.json's `added_tokens_decoder` entries, checking each lands on its declared id."""
    try:
        entries = json.loads(config.read_text(encoding="utf-8")).get("added_tokens_decoder", {})
    except (OSError, ValueError) as e:
        raise TokenizerDirError(f"{config}: cannot read ({e})") from e
    for id_str, spec in sorted(entries.items(), key=lambda kv: int(kv[0])):
        token = AddedToken(spec["content"], single_word=spec.get("single_word", False),
                           lstrip=spec.get("lstrip", False), rstrip=spec.get("rstrip", False),
                           normalized=spec.get("normalized", not spec.get("special", False)),
                           special=spec.get("special", False))
        (tok.add_special_tokens if token.special else tok.add_tokens)([token])
        got = tok.token_to_id(spec["content"])
        if got != int(id_str):
            raise TokenizerDirError(f"{config}: {spec['content']!r} is declared as id {id_str} but lands on {got}")


class TextTokenizer:
    """Qwen2 BPE + CosyVoice specials. Specials are matched anywhere in the text (`[laughter]哈哈`)."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer

    @classmethod
    def from_dir(cls, path: str | Path, specials: tuple[str, ...] = SPECIAL_TOKENS) -> "TextTokenizer":
        """Load a CosyVoice-BlankEN directory and append `specials` (the family's: `ModelFamily.text_specials`);
        errors name the missing or inconsistent file."""
        root = Path(path).expanduser()
        if not root.is_dir():
            raise TokenizerDirError(f"tokenizer directory {root} does not exist or is not a directory")
        if (root / TOKENIZER_JSON).is_file():
            tok = Tokenizer.from_file(str(root / TOKENIZER_JSON))  # carries its own added tokens
        else:
            for name in (VOCAB, MERGES, CONFIG):
                if not (root / name).is_file():
                    raise TokenizerDirError(f"tokenizer directory {root} has no {name} (nor a {TOKENIZER_JSON})")
            try:
                tok = _qwen2_bpe(root / VOCAB, root / MERGES)
            except Exception as e:  # tokenizers raises plain Exception on malformed files
                raise TokenizerDirError(f"{root}: cannot build the BPE from {VOCAB} and {MERGES} ({e})") from e
            _add_config_tokens(tok, root / CONFIG)
        # Tokens already present keep their ids (as transformers' add_special_tokens does).
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; no BOS/EOS."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; special tokens are left out by default, as in the official CosyVoice2 tokenizer."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int:
        """Id of one token (a special like `<|endofprompt|>` or a raw BPE symbol); KeyError if unknown."""
        tid = self._tok.token_to_id(token)
        if tid is None:
            raise KeyError(f"token {token!r} is not in the vocabulary")
        return tid
