"""cosy: CosyVoice2 text-to-speech, served the way large deployments need it.

Data flow: text -> speech tokens (LM) -> mel (cosy.flow) -> 24 kHz wav (cosy.hift).
Public API of the speech core:

    from cosy import load_token2wav, FlowPrompt
    t2w = load_token2wav("path/to/CosyVoice2-0.5B")
    mel = t2w.mel(tokens, prompt)            # (1, T) tokens -> (1, 80, 2T) mel
    wav = t2w.vocode(mel, seed=0)            # (1, 80, F) mel -> (F*480,) wav
    wav = t2w(tokens, prompt, speed=1.0)     # both at once
    s = t2w.stream(prompt); chunks = s.push(new_tokens); last = s.finish()

Importing a submodule (`python -m cosy.deploy.healthcheck`, run every few seconds in each container) must not
import torch: the names above load on first use.
"""
from importlib import import_module

_EXPORTS = {"FlowPrompt": "cosy.pipeline.token2wav", "Token2Wav": "cosy.pipeline.token2wav",
            "Token2WavStream": "cosy.pipeline.token2wav", "load_token2wav": "cosy.pipeline.token2wav",
            "load_flow": "cosy.model.load", "load_hift": "cosy.model.load"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'cosy' has no attribute {name!r}")
