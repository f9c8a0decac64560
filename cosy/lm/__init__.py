"""Speech-token LM of CosyVoice2 (official `Qwen2LM`): text + voice prompt -> speech tokens.

    lm = SpeechLM.from_model_dir("path/to/CosyVoice2-0.5B")
    x = lm.prompt_embeds(text_ids, prompt_text_ids, prompt_speech_tokens)   # (1, L, H)
    min_len, max_len = lm.length_limits(len(text_ids))
    for token in lm.generate(x, min_len, max_len, seed=0):                  # RAS sampling, streamed
        ...
"""
from cosy.lm.config import LMConfig, read_lm_config
from cosy.lm.model import SpeechLM
from cosy.lm.sampling import SamplingParams, ras_distribution, ras_sample

__all__ = ["LMConfig", "SamplingParams", "SpeechLM", "ras_distribution", "ras_sample", "read_lm_config"]
