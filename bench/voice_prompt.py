"""The voice prompt and the sentence the benchmarks speak: assets/zero_shot_prompt.wav (3.5 s) and its
transcript, and a sentence of about 4 s."""
from pathlib import Path

PROMPT_WAV = Path(__file__).resolve().parent.parent / "assets" / "zero_shot_prompt.wav"
PROMPT_TEXT = "希望你以后能够做的比我还好呦。"
TEXT = "收到好友从远方寄来的生日礼物，那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐。"
