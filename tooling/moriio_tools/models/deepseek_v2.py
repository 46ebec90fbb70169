"""A tiny DeepSeek-V2 (``DeepseekV2ForCausalLM``): multi-head latent attention, dense MLPs.

MLA caches one 576-wide latent per token (``kv_lora_rank`` 512 + ``qk_rope_head_dim`` 64,
the only shape vLLM's CPU MLA backend serves). Queries are projected directly
(``q_lora_rank`` null). Every layer is dense: ``first_k_dense_replace`` equals the layer
count, and the MoE keys are integers because transformers' config rejects nulls there.
"""

from __future__ import annotations

from dataclasses import dataclass

from moriio_tools.models.configs import decoder_config, model_dirname
from moriio_tools.models.shapes import Shapes, decoder


@dataclass(frozen=True, slots=True)
class TinyDeepseekV2:
    """Shape of the model: 2 heads of 32 (no-rope) + 64 (rope) query/key dimensions."""

    vocab_size: int = 1000
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 32
    v_head_dim: int = 32
    max_position_embeddings: int = 1024
    seed: int = 0
    std: float = 0.1

    @property
    def norm_weight(self) -> float:
        return 1.0

    @property
    def dirname(self) -> str:
        s = self
        sizes = f"-r{s.kv_lora_rank}-p{s.qk_rope_head_dim}-n{s.qk_nope_head_dim}-v{s.v_head_dim}"
        return model_dirname("deepseek-v2", self, sizes)

    def config(self) -> dict[str, object]:
        return {
            **decoder_config(self, "DeepseekV2ForCausalLM", "deepseek_v2"),
            "num_key_value_heads": self.num_attention_heads,
            "kv_lora_rank": self.kv_lora_rank,
            "q_lora_rank": None,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "v_head_dim": self.v_head_dim,
            "first_k_dense_replace": self.num_hidden_layers,
            "moe_layer_freq": 1,
            "n_routed_experts": 1,
            "n_shared_experts": 0,
            "num_experts_per_tok": 1,
            "moe_intermediate_size": self.intermediate_size,
            "n_group": 1,
            "topk_group": 1,
            "topk_method": "greedy",
            "norm_topk_prob": False,
            "routed_scaling_factor": 1.0,
        }

    def tensor_shapes(self) -> Shapes:
        return decoder(self, self._latent_attention)

    def _latent_attention(self, prefix: str) -> Shapes:
        h, heads, rank = self.hidden_size, self.num_attention_heads, self.kv_lora_rank
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        a = f"{prefix}.self_attn"
        return [
            (f"{a}.q_proj.weight", (heads * qk, h)),
            (f"{a}.kv_a_proj_with_mqa.weight", (rank + self.qk_rope_head_dim, h)),
            (f"{a}.kv_a_layernorm.weight", (rank,)),
            (f"{a}.kv_b_proj.weight", (heads * (self.qk_nope_head_dim + self.v_head_dim), rank)),
            (f"{a}.o_proj.weight", (h, heads * self.v_head_dim)),
        ]
