"""The Laya decision model: a ModernBERT encoder with a typed decision head.

The same module tree, parameter names and forward as upstream Laya's
``laya.common.DecisionModel`` (``laya==0.4.15``, sequential option layout), so an upstream
checkpoint loads strictly and computes the same outputs.

``forward(input_ids, attention_mask, marker_pos, marker_mask, qtype)`` returns
``(decision_logits [rows, slots] fp32, act_logits [rows, n_act])``.  Tokenisation, padding,
calibration (the temperatures of ``rl_agent_config.json``; the ``temperature`` buffer of
shape ``[3]`` is carried as upstream carries it, unused by the forward) and answer
formatting stay with the caller; the forward has no data-dependent Python control flow and is
``torch.export``-able with dynamic rows, tokens and marker slots.  The only branches are on
static facts: ``head_layers == 0`` (no head transformer, as upstream) and a true one-slot
tensor (``slots == 1``), which takes the single-option branch (no runner-up) and needs its
own export.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers import ModernBertConfig, ModernBertModel

QUESTION_TYPES = ("choice", "score", "noul")  # qtype ids 0, 1, 2
MASKED_SLOT_LOGIT = -1e4
MAX_SLOTS_SCALE = 255.0  # the act head sees k / 255
ENTROPY_FLOOR = 1e-9  # upstream's p.clamp_min(1e-9) inside the entropy


class DecisionModel(nn.Module):
    def __init__(self, encoder_config: ModernBertConfig, head_layers: int = 2, n_act: int = 2):
        super().__init__()
        d = encoder_config.hidden_size
        self.encoder = ModernBertModel(encoder_config)
        if head_layers > 0:
            layer = nn.TransformerEncoderLayer(d, max(1, d // 64), 4 * d, batch_first=True,
                                               norm_first=True)
            # norm_first layers never take the nested-tensor fast path; saying so avoids a warning.
            self.head = nn.TransformerEncoder(layer, head_layers, enable_nested_tensor=False)
        else:
            self.head = None
        self.type_emb = nn.Embedding(len(QUESTION_TYPES), d)
        self.scorer = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))
        self.act_head = nn.Sequential(nn.Linear(d + 4, 256), nn.GELU(), nn.Linear(256, n_act))
        # One per question type, as upstream registers it (torch.ones(3)); not used by forward.
        self.register_buffer("temperature", torch.ones(len(QUESTION_TYPES)))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                marker_pos: torch.Tensor, marker_mask: torch.Tensor, qtype: torch.Tensor):
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        states = states + self.type_emb(qtype)[:, None]
        index = marker_pos
        if self.head is not None:
            states, index = self.run_head(states, attention_mask, marker_pos)

        index = index.clamp(min=0)[:, :, None].expand(-1, -1, states.shape[-1])
        markers = torch.gather(states, 1, index)
        logits = self.scorer(markers).squeeze(-1).float()
        logits = logits.masked_fill(marker_mask == 0, MASKED_SLOT_LOGIT)
        return logits, self.act_head(self.act_features(states, logits, marker_mask))

    def run_head(self, states: torch.Tensor, attention_mask: torch.Tensor,
                 marker_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's layers over ``states``, layer by layer as upstream runs them: ``(states,
        index)``, the head's output and each marker's position in it (``marker_pos``'s: the class
        state at 0, a masked slot's -1).  An export may run it otherwise
        (:mod:`laya_build.model.head`)."""
        padding = attention_mask == 0
        for layer in self.head.layers:
            states = layer(states, src_key_padding_mask=padding)
        return states, marker_pos

    def act_features(self, states: torch.Tensor, logits: torch.Tensor,
                     marker_mask: torch.Tensor) -> torch.Tensor:
        """``[CLS state, top1, top1 - top2, entropy / log k, k / 255]``, cast for the act head.

        Softmax and entropy are fp32.  Outside autocast the concatenation is cast to the act
        head's weight dtype (explicit bf16 weights would otherwise meet fp32 features); under
        autocast it is left to autocast's own casts.
        """
        probs = torch.softmax(logits.float(), dim=-1)
        if probs.shape[-1] >= 2:
            top1, top2 = top_two(probs)
        else:  # single-option branch: a static shape decision, resolved at export time
            top1 = probs[:, 0]
            top2 = torch.zeros_like(top1)
        entropy = -(probs * torch.log(probs.clamp_min(ENTROPY_FLOOR))).sum(-1)
        k = (marker_mask != 0).sum(-1).clamp(min=2).float()
        feats = torch.cat([
            states[:, 0].float(),
            top1[:, None],
            (top1 - top2)[:, None],
            (entropy / torch.log(k))[:, None],
            (k / MAX_SLOTS_SCALE)[:, None],
        ], dim=-1)
        if not torch.is_autocast_enabled(feats.device.type):
            feats = feats.to(self.act_head[0].weight.dtype)
        return feats


def top_two(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The largest and second largest value of each row of ``probs`` (``[B, k]``, ``k >= 2``):
    ``probs.topk(2).values``, bit for bit (a tie gives the tied value twice), as two max
    reductions.  A compiler fuses those into the kernels around them; ``topk`` is a sort of its
    own (two kernels on CUDA)."""
    top1, first = probs.max(dim=-1)
    taken = torch.arange(probs.shape[-1], device=probs.device) == first[:, None]
    return top1, probs.masked_fill(taken, float("-inf")).amax(dim=-1)


def eval_copy(model: nn.Module, dtype: torch.dtype, device: str | torch.device = "cpu") -> nn.Module:
    """A separate eval-mode copy of ``model`` with explicit ``dtype`` weights on ``device``.

    This is how a model is prepared for export: the weights themselves are converted,
    outside autocast (an export captured under autocast cannot be packaged outside it).
    """
    import copy

    if torch.is_autocast_enabled(torch.device(device).type):
        raise RuntimeError("eval_copy must be called outside autocast")
    return copy.deepcopy(model).to(device=device, dtype=dtype).eval()
