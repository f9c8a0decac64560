"""The flow stage, speech tokens -> mel: official `CausalMaskedDiffWithXvec` (inference only)."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosy.flow.conditions import prompt_cond
from cosy.flow.config import EstimatorConfig, FlowConfig
from cosy.flow.decoder import CausalConditionalDecoder
from cosy.flow.encoder import UpsampleConformerEncoder
from cosy.flow.flow_matching import CausalConditionalCFM


class FlowModel(nn.Module):
    """Token embedding + conformer encoder (x2 upsampling) + conditional flow matching decoder.

    Attribute names mirror the official state-dict keys, so `load_state_dict(torch.load('flow.pt'))` works
    as is. The module keeps no per-request state; concurrent calls may share it.

    estimator: the CFM's velocity estimator class, from the model family (`ModelFamily.flow_estimator`, see
    `cosy.model.load.load_flow`); CosyVoice2's U-Net when not given.
    """

    def __init__(self, cfg: FlowConfig,
                 estimator: Callable[[EstimatorConfig], nn.Module] = CausalConditionalDecoder):
        super().__init__()
        enc = cfg.encoder
        if enc.pre_lookahead_len != cfg.pre_lookahead_len or enc.upsample_stride != cfg.token_mel_ratio:
            raise ValueError("encoder pre_lookahead_len / upsample_stride must equal the flow's "
                             "pre_lookahead_len / token_mel_ratio")
        if cfg.estimator.in_channels != 4 * cfg.output_size:
            raise ValueError("estimator in_channels must be 4 * output_size (x, mu, spks, cond)")
        self.cfg = cfg
        # Random init is thrown away (weights come from flow.pt); don't let it consume the caller's CPU RNG.
        with torch.random.fork_rng(devices=[]):
            self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
            self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
            self.encoder = UpsampleConformerEncoder(enc)
            self.encoder_proj = nn.Linear(enc.output_size, cfg.output_size)
            self.decoder = CausalConditionalCFM(cfg.cfm, cfg.estimator, estimator)

    @property
    def stream_chunk_tokens(self) -> int:
        """Tokens per streaming attention chunk (the encoder's; the estimator's chunk is ratio x this)."""
        return self.cfg.encoder.static_chunk_size

    @torch.inference_mode()
    def conditions(self, token: Tensor, prompt_token: Tensor, prompt_feat: Tensor, embedding: Tensor,
                   streaming: bool, finalize: bool) -> tuple[Tensor, Tensor, Tensor]:
        """What the CFM decoder is conditioned on, over prompt + target frames.

        Returns mu (1, 80, T_mel) encoder output, spks (1, 80) projected speaker embedding and cond
        (1, 80, T_mel) = the prompt mel in the first frames, zeros after. Arguments as in `inference`.
        """
        cfg = self.cfg
        dtype = self.spk_embed_affine_layer.weight.dtype
        spks = self.spk_embed_affine_layer(F.normalize(embedding.to(dtype), dim=1))

        tokens = torch.cat([prompt_token, token], dim=1)
        x = self.input_embedding(tokens.clamp(min=0))
        context = None
        if not finalize:
            if tokens.size(1) <= cfg.pre_lookahead_len:
                raise ValueError("a non-final chunk needs more tokens than pre_lookahead_len")
            x, context = x[:, :-cfg.pre_lookahead_len], x[:, -cfg.pre_lookahead_len:]
        h = self.encoder_proj(self.encoder(x, context, streaming))  # (1, T_mel, 80)

        cond = prompt_cond([prompt_feat], [h.size(1)], h, cfg.output_size)
        return h.transpose(1, 2).contiguous(), spks, cond

    @torch.inference_mode()
    def inference(self, token: Tensor, prompt_token: Tensor, prompt_feat: Tensor, embedding: Tensor,
                  streaming: bool, finalize: bool) -> Tensor:
        """Generate the mel for `token`, continuing the prompt.

        Args:
            token: (1, T) int speech tokens to synthesise.  prompt_token: (1, Tp) int prompt tokens.
            prompt_feat: (1, Tm, 80) float prompt mel.  embedding: (1, 192) speaker embedding.
            streaming: chunk attention masks in encoder and estimator (else full attention).
            finalize: False for a non-final streaming chunk: the last pre_lookahead_len tokens are look-ahead
                context only and produce no mel.
        Returns:
            (1, 80, ratio*(Tp + T [- pre_lookahead_len if not finalize]) - Tm) float32 mel.
        """
        mu, spks, cond = self.conditions(token, prompt_token, prompt_feat, embedding, streaming, finalize)
        mel = self.decoder(mu, spks, cond, streaming)
        return mel[:, :, prompt_feat.size(1):].float()

    def supports_batch(self) -> bool:
        """Whether `inference_batch` runs one padded batch (the estimator takes padding masks)."""
        return isinstance(self.decoder.estimator, CausalConditionalDecoder)

    @torch.inference_mode()
    def inference_batch(self, rows: list[tuple[Tensor, Tensor, Tensor, Tensor]]) -> list[Tensor]:
        """Whole utterances (non-streaming, final) of several requests as one padded batch.

        rows: (token (1, T), prompt_token (1, Tp), prompt_feat (1, Tm, 80), embedding (1, 192)) per request,
        of any lengths. Returns each row's `inference(..., streaming=False, finalize=True)` mel, equal to the
        solo call to float rounding: tokens are right-padded, attention masks padded keys, padded frames
        are zeroed before every conv, each row has its own prompt length and starts from the fixed noise
        at frame 0; the CFG pair doubles the batch. An estimator without padding masks runs the rows solo.
        """
        if len(rows) == 1 or not self.supports_batch():
            return [self.inference(*r, streaming=False, finalize=True) for r in rows]
        cfg = self.cfg
        dev = self.spk_embed_affine_layer.weight.device
        dtype = self.spk_embed_affine_layer.weight.dtype
        seqs = [torch.cat([pt.to(dev), t.to(dev)], dim=1)[0] for t, pt, _, _ in rows]
        n_tokens = [s.numel() for s in seqs]  # host lengths: no device read per row (a sync each on CUDA)
        n_mel = [n * cfg.token_mel_ratio for n in n_tokens]
        lengths = torch.tensor(n_tokens, device=dev)
        tokens = nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=0)
        emb = torch.cat([e.to(dev) for _, _, _, e in rows])
        spks = self.spk_embed_affine_layer(F.normalize(emb.to(dtype), dim=1))
        x = self.input_embedding(tokens.clamp(min=0))
        h = self.encoder_proj(self.encoder(x, None, False, lengths=lengths))  # (B, ratio*T, 80)
        mel_lengths = lengths * cfg.token_mel_ratio
        cond = prompt_cond([pf for _, _, pf, _ in rows], n_mel, h, cfg.output_size)
        valid = (torch.arange(h.size(1), device=dev).unsqueeze(0) < mel_lengths.unsqueeze(1)).to(h.dtype)
        mu = h.transpose(1, 2) * valid.unsqueeze(1)
        mel = self.decoder(mu.contiguous(), spks, cond, False, lengths=mel_lengths)
        return [mel[i:i + 1, :, pf.size(1):n].float() for i, ((_, _, pf, _), n) in enumerate(zip(rows, n_mel))]
