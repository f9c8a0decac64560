"""The CosyVoice3 family for the speech tests, until `cosy/model/families/cosyvoice3.py` is in this branch.

That module (another branch) defines the real family; `cv3_family()` returns it when it is registered and
registers this stand-in otherwise. Only the fields the speech half reads are meaningful here: the yaml
classes, the flow/HiFT class specs and the stream vocoder. Delete this file once the family has landed.
"""
from __future__ import annotations

from cosy.model import families
from cosy.model.family import EmbeddingRow, ModelFamily, ModelFiles, SpeechTokens

STANDIN = ModelFamily(
    name="cosyvoice3",
    files=ModelFiles(yaml="cosyvoice3.yaml", speech_tokenizer="speech_tokenizer_v3.onnx"),
    tokens=SpeechTokens(size=6561, vocab=6761, eos=6562, stop=tuple(range(6561, 6761)), fill=6564, min_len_mask=6561),
    sos=EmbeddingRow("speech_embedding", 6561),
    task_id=EmbeddingRow("speech_embedding", 6563),
    yaml_classes=(("flow", "CausalMaskedDiffWithDiT"), ("flow.pre_lookahead_layer", "PreLookaheadLayer"),
                  ("flow.decoder", "CausalConditionalCFM"), ("flow.decoder.estimator", "DiT"),
                  ("hift", "CausalHiFTGenerator"), ("hift.f0_predictor", "CausalConvRNNF0Predictor")),
    vllm_architecture="CosyVoice3ForCausalLM",
    vllm_model="cosy.vllm_plugin.model:CosyVoice3ForCausalLM",
    served_name_prefix="cosyvoice3",
    export_weights=(),
    flow="cosy.flow.dit_model:DiTFlowModel",
    flow_estimator="cosy.flow.dit:DiT",
    hift="cosy.hift.causal_generator:CausalHiFTGenerator",
    stream_vocoder="cosy.pipeline.stream_vocoder:RevocodeVocoder",
)


def cv3_family() -> ModelFamily:
    try:
        return families.get("cosyvoice3")
    except KeyError:
        return families.register(STANDIN)
