"""Text frontend: normalization (ttsfrd or wetext), sentence splitting and the Qwen2 tokenizer."""
from cosy.text.frontend import TextFrontend
from cosy.text.tokenizer import ENDOFPROMPT_ID, EOS_ID, SPECIAL_TOKENS, TextTokenizer, TokenizerDirError

__all__ = ["TextFrontend", "TextTokenizer", "TokenizerDirError", "SPECIAL_TOKENS", "ENDOFPROMPT_ID", "EOS_ID"]
