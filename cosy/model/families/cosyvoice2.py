"""CosyVoice2 (`iic/CosyVoice2-0.5B`): Qwen2 LM with a biased head over 6564 ids, conformer + U-Net flow, HiFT."""
from cosy.model.family import EmbeddingRow, ModelFamily, ModelFiles, SpeechTokens

FAMILY = ModelFamily(
    name="cosyvoice2",
    display_name="CosyVoice2",
    files=ModelFiles(yaml="cosyvoice2.yaml", speech_tokenizer="speech_tokenizer_v2.onnx"),
    # speech tokens 0..6560; eos 6561; 6562 also stops; fill 6563. Before min_len only eos is masked.
    tokens=SpeechTokens(size=6561, vocab=6564, eos=6561, stop=(6561, 6562, 6563), fill=6563, min_len_mask=6561),
    sos=EmbeddingRow("llm_embedding", 0),
    task_id=EmbeddingRow("llm_embedding", 1),
    yaml_classes=(
        ("flow", "CausalMaskedDiffWithXvec"),
        ("flow.encoder", "UpsampleConformerEncoder"),
        ("flow.decoder", "CausalConditionalCFM"),
        ("flow.decoder.estimator", "CausalConditionalDecoder"),
        ("hift", "HiFTGenerator"),
        ("hift.f0_predictor", "ConvRNNF0Predictor"),
    ),
    vllm_architecture="CosyVoice2ForCausalLM",
    vllm_model="cosy.vllm_plugin.model:CosyVoice2ForCausalLM",
    served_name_prefix="cosyvoice2",
    # decode steps feed speech tokens: embed_tokens = speech_embedding; lm_head = llm_decoder, with bias
    export_weights=(("model.embed_tokens.weight", "speech_embedding.weight"),
                    ("lm_head.weight", "llm_decoder.weight"),
                    ("lm_head.bias", "llm_decoder.bias")),
)
