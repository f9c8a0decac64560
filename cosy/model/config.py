"""The hyperparameters of a model directory, read out of its yaml (`cosyvoice2.yaml`) as data.

Only the values our modules need are taken; the yaml's class names are checked against the family's
`yaml_classes` (so a CosyVoice 1 or 3 yaml under the wrong name fails clearly) but never imported.
The flow and vocoder sections are read by the family's readers (`ModelFamily.flow_config` / `.hift_config`,
"module:function" taking (doc, expected_classes)) on first use, so the LM side of a directory needs only
the LM's code; CosyVoice2's readers are `read_flow_config` / `read_hift_config` here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from cosy.flow.config import CFMConfig, EncoderConfig, EstimatorConfig, FlowConfig
from cosy.hift.config import HiFTConfig
from cosy.model import families
from cosy.model.family import ModelFamily, import_object
from cosy.model.hyperyaml import Tagged, load_hyperyaml


@dataclass
class SamplingParams:
    """RAS sampling of the LM (`llm.sampling` in the yaml), plus per-request switches."""

    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1
    greedy: bool = False  # argmax instead of RAS (tests, comparisons with other engines)
    ignore_stop: bool = False  # never stop before max_len (benchmarks with fixed token counts)


@dataclass
class ModelConfig:
    """Everything our stages need from `cosyvoice2.yaml`."""

    sample_rate: int
    token_frame_rate: int
    chunk_size: int  # streaming chunk in speech tokens
    llm_input_size: int
    speech_token_size: int
    sampling: SamplingParams  # RAS parameters of `llm.sampling`
    family: ModelFamily = field(repr=False)
    doc: dict = field(repr=False, default_factory=dict)  # the whole yaml as data
    yaml_path: str = ""

    def _part(self, spec: str):
        try:
            return import_object(spec)(self.doc, self.family.expected_classes)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{self.yaml_path}: {e}") from None

    @cached_property
    def flow(self) -> FlowConfig:
        """The flow's hyperparameters (the family's type: CosyVoice2 `FlowConfig`)."""
        return self._part(self.family.flow_config)

    @cached_property
    def hift(self) -> HiFTConfig:
        """The vocoder's hyperparameters (the family's type: CosyVoice2 `HiFTConfig`)."""
        return self._part(self.family.hift_config)


def _node(doc: dict, path: str, expected_classes: dict[str, str]) -> Tagged:
    """The tagged node at dotted `path`; ValueError unless it builds the family's class for that path."""
    node: Any = doc
    for part in path.split("."):
        node = node.get(part) if isinstance(node, (dict, Tagged)) else None
    expected = expected_classes[path]
    if not isinstance(node, Tagged) or node.target.rsplit(".", 1)[-1] != expected:
        found = node.target if isinstance(node, Tagged) else type(node).__name__
        raise ValueError(f"'{path}' should be a !new:...{expected}, found {found}")
    return node


def read_flow_config(doc: dict, classes: dict[str, str]) -> FlowConfig:
    """CosyVoice2's flow section (CausalMaskedDiffWithXvec, conformer encoder, U-Net estimator)."""
    flow, enc = _node(doc, "flow", classes), _node(doc, "flow.encoder", classes)
    cfm, est = _node(doc, "flow.decoder", classes), _node(doc, "flow.decoder.estimator", classes)
    cfm_params = cfm.get("cfm_params")
    cfm_params = cfm_params.get("content", {}) if isinstance(cfm_params, Tagged) else (cfm_params or {})
    ratio = int(flow.get("token_mel_ratio", 2))
    lookahead = int(flow.get("pre_lookahead_len", 3))
    return FlowConfig(
        vocab_size=int(flow["vocab_size"]),
        input_size=int(flow["input_size"]),
        output_size=int(flow["output_size"]),
        spk_embed_dim=int(flow["spk_embed_dim"]),
        token_mel_ratio=ratio,
        pre_lookahead_len=lookahead,
        encoder=EncoderConfig(
            input_size=int(enc["input_size"]),
            output_size=int(enc["output_size"]),
            attention_heads=int(enc["attention_heads"]),
            linear_units=int(enc["linear_units"]),
            num_blocks=int(enc["num_blocks"]),
            static_chunk_size=int(enc.get("static_chunk_size", 25)),
            pre_lookahead_len=lookahead,
            upsample_stride=ratio,
        ),
        estimator=EstimatorConfig(
            in_channels=int(est["in_channels"]),
            out_channels=int(est["out_channels"]),
            channels=tuple(int(c) for c in est["channels"]),
            attention_head_dim=int(est["attention_head_dim"]),
            n_blocks=int(est["n_blocks"]),
            num_mid_blocks=int(est["num_mid_blocks"]),
            num_heads=int(est["num_heads"]),
            static_chunk_size=int(est.get("static_chunk_size", 50)),
            num_decoding_left_chunks=int(est.get("num_decoding_left_chunks", -1)),
        ),
        cfm=CFMConfig(
            inference_cfg_rate=float(cfm_params.get("inference_cfg_rate", 0.7)),
            t_scheduler=str(cfm_params.get("t_scheduler", "cosine")),
        ),
    )


def read_hift_config(doc: dict, classes: dict[str, str]) -> HiFTConfig:
    """CosyVoice2's vocoder section (HiFTGenerator, ConvRNNF0Predictor)."""
    hift, f0 = _node(doc, "hift", classes), _node(doc, "hift.f0_predictor", classes)
    istft = hift["istft_params"]
    return HiFTConfig(
        in_channels=int(hift["in_channels"]),
        base_channels=int(hift["base_channels"]),
        nb_harmonics=int(hift["nb_harmonics"]),
        sampling_rate=int(hift["sampling_rate"]),
        nsf_alpha=float(hift["nsf_alpha"]),
        nsf_sigma=float(hift["nsf_sigma"]),
        nsf_voiced_threshold=float(hift["nsf_voiced_threshold"]),
        upsample_rates=tuple(hift["upsample_rates"]),
        upsample_kernel_sizes=tuple(hift["upsample_kernel_sizes"]),
        istft_n_fft=int(istft["n_fft"]),
        istft_hop_len=int(istft["hop_len"]),
        resblock_kernel_sizes=tuple(hift["resblock_kernel_sizes"]),
        resblock_dilation_sizes=tuple(tuple(d) for d in hift["resblock_dilation_sizes"]),
        source_resblock_kernel_sizes=tuple(hift["source_resblock_kernel_sizes"]),
        source_resblock_dilation_sizes=tuple(tuple(d) for d in hift["source_resblock_dilation_sizes"]),
        lrelu_slope=float(hift["lrelu_slope"]),
        audio_limit=float(hift["audio_limit"]),
        f0_num_class=int(f0.get("num_class", 1)),
        f0_in_channels=int(f0.get("in_channels", 80)),
        f0_cond_channels=int(f0.get("cond_channels", 512)),
    )


def read_model_config(yaml_path: str | Path, family: ModelFamily | None = None) -> ModelConfig:
    """Read a family's yaml (default: the family the file name identifies, e.g. `cosyvoice2.yaml`).

    Raises ValueError naming the file and the key when something is off.
    """
    if family is None:
        family = next((f for f in families.families() if f.files.yaml == Path(yaml_path).name), None)
        if family is None:
            raise ValueError(f"{yaml_path}: not the yaml of a known model family (one of "
                             f"{', '.join(families.yaml_names())})")
    classes = family.expected_classes
    doc = load_hyperyaml(yaml_path, overrides={"qwen_pretrain_path": ""})
    try:
        llm = doc["llm"]
        sampling = llm.get("sampling") if isinstance(llm, Tagged) else None
        cfg = ModelConfig(
            sample_rate=int(doc["sample_rate"]),
            token_frame_rate=int(doc.get("token_frame_rate", 25)),
            chunk_size=int(doc.get("chunk_size", 25)),
            llm_input_size=int(llm["llm_input_size"]),
            speech_token_size=int(llm["speech_token_size"]),
            sampling=SamplingParams(**{k: sampling.get(k, getattr(SamplingParams, k))
                                       for k in ("top_p", "top_k", "win_size", "tau_r")})
            if isinstance(sampling, Tagged) else SamplingParams(),
            family=family, doc=doc, yaml_path=str(yaml_path),
        )
        for path in classes:  # every class the family expects, checked now (the values are read on use)
            _node(doc, path, classes)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{yaml_path}: {e}") from None
    if cfg.speech_token_size != family.tokens.size:
        raise ValueError(f"{yaml_path}: llm.speech_token_size is {cfg.speech_token_size}, but a {family.name} "
                         f"model has {family.tokens.size} speech tokens")
    return cfg
