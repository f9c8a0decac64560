"""CosyVoice3's flow stage, speech tokens -> mel: official `CausalMaskedDiffWithDiT` (inference only).

No conformer encoder: the token embedding (80 wide) goes through a pre-lookahead layer (3 tokens of
right context), each frame is repeated token_mel_ratio times, and that is `mu` for the CFM, whose
estimator is the DiT (`cosy.flow.dit`). The CFM sampler, its fixed seed-0 noise and classifier-free
guidance are CosyVoice2's (`cosy.flow.flow_matching`). The interface equals `cosy.flow.model.FlowModel`'s,
so `cosy.pipeline.token2wav` drives either.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosy.flow.conditions import prompt_cond
from cosy.flow.dit import DiT
from cosy.flow.dit_config import DiTConfig, DiTFlowConfig
from cosy.flow.encoder import PreLookaheadLayer
from cosy.flow.flow_matching import CausalConditionalCFM


class DiTFlowModel(nn.Module):
    """Token embedding + pre-lookahead layer + CFM with a DiT estimator. Keys mirror flow.pt.

    estimator: the CFM's velocity estimator class (the family's `flow_estimator`); the DiT by default.
    Keeps no per-request state.
    """

    def __init__(self, cfg: DiTFlowConfig, estimator: Callable[[DiTConfig], nn.Module] = DiT):
        super().__init__()
        est = cfg.estimator
        if cfg.input_size != est.mu_dim or est.mel_dim != cfg.output_size or est.spk_dim != cfg.output_size:
            raise ValueError("DiT mu_dim must equal the flow input_size, mel_dim and spk_dim its output_size")
        self.cfg = cfg
        # Random init is thrown away (weights come from flow.pt); don't let it consume the caller's CPU RNG.
        with torch.random.fork_rng(devices=[]):
            self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
            self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
            self.pre_lookahead_layer = PreLookaheadLayer(cfg.input_size, cfg.pre_lookahead_len,
                                                         hidden=cfg.pre_lookahead_channels)
            self.decoder = CausalConditionalCFM(cfg.cfm, est, estimator)

    @property
    def stream_chunk_tokens(self) -> int:
        """Tokens per streaming attention chunk of the DiT (static_chunk_size mel frames)."""
        return self.cfg.estimator.static_chunk_size // self.cfg.token_mel_ratio

    @torch.inference_mode()
    def conditions(self, token: Tensor, prompt_token: Tensor, prompt_feat: Tensor, embedding: Tensor,
                   streaming: bool, finalize: bool) -> tuple[Tensor, Tensor, Tensor]:
        """What the CFM is conditioned on, over prompt + target frames.

        Returns mu (1, 80, T_mel), spks (1, 80) and cond (1, 80, T_mel) (prompt mel, then zeros).
        `streaming` does not change these (no encoder): only the estimator's mask depends on it.
        """
        cfg = self.cfg
        dtype = self.spk_embed_affine_layer.weight.dtype
        spks = self.spk_embed_affine_layer(F.normalize(embedding.to(dtype), dim=1))
        x = self.input_embedding(torch.cat([prompt_token, token], dim=1).clamp(min=0))
        if finalize:
            h = self.pre_lookahead_layer(x)
        else:
            if x.size(1) <= cfg.pre_lookahead_len:
                raise ValueError("a non-final chunk needs more tokens than pre_lookahead_len")
            n = cfg.pre_lookahead_len
            h = self.pre_lookahead_layer(x[:, :-n], context=x[:, -n:])
        h = h.repeat_interleave(cfg.token_mel_ratio, dim=1)  # (1, T_mel, 80)

        cond = prompt_cond([prompt_feat], [h.size(1)], h, cfg.output_size)
        return h.transpose(1, 2).contiguous(), spks, cond

    @torch.inference_mode()
    def inference(self, token: Tensor, prompt_token: Tensor, prompt_feat: Tensor, embedding: Tensor,
                  streaming: bool, finalize: bool) -> Tensor:
        """Generate the mel for `token`, continuing the prompt.

        Args:
            token: (1, T) int speech tokens.  prompt_token: (1, Tp) int.  prompt_feat: (1, Tm, 80) prompt mel.
            embedding: (1, 192) speaker embedding.  streaming: block-causal DiT attention.
            finalize: False for a non-final streaming chunk: the last pre_lookahead_len tokens are context only.
        Returns:
            (1, 80, ratio*(Tp + T [- pre_lookahead_len if not finalize]) - Tm) float32 mel.
        """
        mu, spks, cond = self.conditions(token, prompt_token, prompt_feat, embedding, streaming, finalize)
        mel = self.decoder(mu, spks, cond, streaming)
        return mel[:, :, prompt_feat.size(1):].float()

    def supports_batch(self) -> bool:
        """Whether `inference_batch` runs one padded batch (the estimator takes padding masks)."""
        return isinstance(self.decoder.estimator, DiT)

    @torch.inference_mode()
    def inference_batch(self, rows: list[tuple[Tensor, Tensor, Tensor, Tensor]]) -> list[Tensor]:
        """Whole utterances (non-streaming, final) of several requests as one padded batch.

        rows: (token (1, T), prompt_token (1, Tp), prompt_feat (1, Tm, 80), embedding (1, 192)) per request.
        Returns each row's `inference(..., streaming=False, finalize=True)` mel, equal to the solo call to
        float rounding: padded tokens embed as zeros (the official masks them so; a row's last tokens then
        see the zero look-ahead of a solo call), padded keys are masked, each row starts from the fixed noise
        at frame 0; the CFG pair doubles the batch.
        """
        if len(rows) == 1 or not self.supports_batch():
            return [self.inference(*r, streaming=False, finalize=True) for r in rows]
        cfg = self.cfg
        dev = self.spk_embed_affine_layer.weight.device
        dtype = self.spk_embed_affine_layer.weight.dtype
        seqs = [torch.cat([pt.to(dev), t.to(dev)], dim=1)[0] for t, pt, _, _ in rows]
        n_mel = [s.numel() * cfg.token_mel_ratio for s in seqs]  # host lengths: no device read per row
        lengths = torch.tensor([s.numel() for s in seqs], device=dev)
        tokens = nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=0)
        valid_tokens = torch.arange(tokens.size(1), device=dev).unsqueeze(0) < lengths.unsqueeze(1)
        x = self.input_embedding(tokens.clamp(min=0)) * valid_tokens.unsqueeze(-1).to(dtype)
        emb = torch.cat([e.to(dev) for _, _, _, e in rows])
        spks = self.spk_embed_affine_layer(F.normalize(emb.to(dtype), dim=1))
        h = self.pre_lookahead_layer(x).repeat_interleave(cfg.token_mel_ratio, dim=1)  # (B, T_mel, 80)
        mel_lengths = lengths * cfg.token_mel_ratio
        valid = (torch.arange(h.size(1), device=dev).unsqueeze(0) < mel_lengths.unsqueeze(1)).to(h.dtype)
        mu = (h.transpose(1, 2) * valid.unsqueeze(1)).contiguous()
        cond = prompt_cond([pf for _, _, pf, _ in rows], n_mel, h, cfg.output_size)
        mel = self.decoder(mu, spks, cond, False, lengths=mel_lengths)
        return [mel[i:i + 1, :, pf.size(1):n].float() for i, ((_, _, pf, _), n) in enumerate(zip(rows, n_mel))]
