"""Voice prompt encoding: speech tokens, aligned flow mel and speaker embedding from prompt audio."""
from cosy.prompt.encoder import PromptFeatures, VoicePromptEncoder, align
from cosy.prompt.onnx_models import SpeakerEmbedder, SpeechTokenizer

__all__ = ["PromptFeatures", "SpeakerEmbedder", "SpeechTokenizer", "VoicePromptEncoder", "align"]
