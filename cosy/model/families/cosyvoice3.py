"""CosyVoice3 (`FunAudioLLM/Fun-CosyVoice3-0.5B-2512`): Qwen2 LM whose 6761-row speech vocabulary holds sos, eos,
task_id and fill (head without bias), DiT flow, causal HiFT, speech tokenizer v3, 260 phoneme text tokens.

Facts: `shared/ARCHITECTURE-cosyvoice3.md`. The LM is our `SpeechLM` (same backbone and decode loop); what
differs is data here: no `llm_embedding` table (sos and task_id are rows of `speech_embedding`), the stop set
6561..6760, the silent-token rule, the system prompt and instruct2's caller-made prompt.
"""
from cosy.model.family import EmbeddingRow, ModelFamily, ModelFiles, SpeechTokens

SIZE = 6561  # speech tokens 0..6560
SOS, EOS, TASK_ID, FILL = SIZE, SIZE + 1, SIZE + 2, SIZE + 3  # 6561, 6562, 6563, 6564
VOCAB = SIZE + 200  # 6761 rows; 6565..6760 unused
SILENT = (1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323)  # official `CosyVoice3Model.silent_tokens`

FAMILY = ModelFamily(
    name="cosyvoice3",
    display_name="CosyVoice3",
    files=ModelFiles(yaml="cosyvoice3.yaml", speech_tokenizer="speech_tokenizer_v3.onnx",
                     llm_variants=(("rl", "llm.rl.pt"),)),  # the RL-tuned LM shipped beside llm.pt
    # every id >= 6561 stops; quirk: before min_len the official sampler masks 6561 (sos), so eos is never blocked
    tokens=SpeechTokens(size=SIZE, vocab=VOCAB, eos=EOS, stop=tuple(range(SIZE, VOCAB)), fill=FILL,
                        min_len_mask=SOS, silent=SILENT, max_silent_run=5),
    sos=EmbeddingRow("speech_embedding", SOS),
    task_id=EmbeddingRow("speech_embedding", TASK_ID),
    yaml_classes=(
        ("llm", "CosyVoice3LM"),
        ("flow", "CausalMaskedDiffWithDiT"),
        ("flow.pre_lookahead_layer", "PreLookaheadLayer"),
        ("flow.decoder", "CausalConditionalCFM"),
        ("flow.decoder.estimator", "DiT"),
        ("hift", "CausalHiFTGenerator"),
        ("hift.f0_predictor", "CausalConvRNNF0Predictor"),
    ),
    vllm_architecture="CosyVoice3ForCausalLM",
    vllm_model="cosy.vllm_plugin.model:CosyVoice3ForCausalLM",
    served_name_prefix="cosyvoice3",
    # decode steps feed speech tokens: embed_tokens = speech_embedding; lm_head = llm_decoder, no bias
    export_weights=(("model.embed_tokens.weight", "speech_embedding.weight"),
                    ("lm_head.weight", "llm_decoder.weight")),
    lm_head_bias=False,
    text_specials="cosy.text.specials:COSYVOICE3",
    system_prompt="You are a helpful assistant.<|endofprompt|>",
    phoneme_tags=True,
    bistream_prefix_end=151646,  # <|endofprompt|>
    instruct_requires_end=True,
    instruct_example="You are a helpful assistant. 请用广东话表达。<|endofprompt|>",
    instruct_examples=tuple(f"You are a helpful assistant. {t}<|endofprompt|>" for t in (
        "请用四川话说这句话。", "请用广东话表达。", "请用尽可能快地语速说一句话。", "请非常开心地说一句话。")),
    prompt_mel_fmax=None,
    flow="cosy.flow.dit_model:DiTFlowModel",
    flow_estimator="cosy.flow.dit:DiT",
    hift="cosy.hift.causal_generator:CausalHiFTGenerator",
    stream_vocoder="cosy.pipeline.stream_vocoder:CausalStreamVocoder",
    golden_handlers=("cosy.verify.golden_cv3:HANDLERS", "cosy.verify.golden_cv3_speech:HANDLERS",
                     "cosy.verify.golden_bistream:HANDLERS"),
)
