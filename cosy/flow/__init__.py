"""Flow stage of CosyVoice2: speech tokens -> mel (official `CausalMaskedDiffWithXvec`)."""
from cosy.flow.config import CFMConfig, EncoderConfig, EstimatorConfig, FlowConfig
from cosy.flow.model import FlowModel

__all__ = ["CFMConfig", "EncoderConfig", "EstimatorConfig", "FlowConfig", "FlowModel"]
