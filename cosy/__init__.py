"""cosy: CosyVoice2 text-to-speech, served the way large deployments need it.

Data flow: text -> speech tokens (LM) -> mel (cosy.flow) -> 24 kHz wav (cosy.hift).
Public API of the speech core:

    from cosy import load_token2wav, FlowPrompt
    t2w = load_token2wav("path/to/CosyVoice2-0.5B")
    mel = t2w.mel(tokens, prompt)            # (1, T) tokens -> (1, 80, 2T) mel
    wav = t2w.vocode(mel, seed=0)            # (1, 80, F) mel -> (F*480,) wav
    wav = t2w(tokens, prompt, speed=1.0)     # both at once
    s = t2w.stream(prompt); chunks = s.push(new_tokens); last = s.finish()
"""
from cosy.model.load import load_flow, load_hift
from cosy.pipeline.token2wav import FlowPrompt, Token2Wav, Token2WavStream, load_token2wav

__all__ = ["FlowPrompt", "Token2Wav", "Token2WavStream", "load_flow", "load_hift", "load_token2wav"]
