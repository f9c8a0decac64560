"""Word timings through an optional CTC forced aligner (`--aligner MODEL_DIR`): the wav2vec2 CTC model
(`wav2vec2`), its config (`config`), the Viterbi alignment (`ctc`), words and romanization (`words`), and
loading plus per-sentence alignment (`aligner`)."""
