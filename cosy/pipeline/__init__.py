"""The synthesis pipeline: the typed request, token2wav (flow + HiFT), and the engine that runs every mode."""
