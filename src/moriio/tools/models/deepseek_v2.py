"""A tiny DeepSeek-V2 (``DeepseekV2ForCausalLM``): multi-head latent attention, dense MLPs.

MLA caches one 576-wide latent per token (``kv_lora_rank`` 512 + ``qk_rope_head_dim`` 64,
the only shape vLLM's CPU MLA backend serves). Queries are projected directly
(``q_lora_rank`` null). Every layer is dense: ``first_k_dense_replace`` equals the layer
count, and the MoE keys are integers because transformers' config rejects nulls there.
"""

from __future__ import annotations

from dataclasses import dataclass

from moriio.tools.models.shapes import Shapes, mlp


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
        return (
            f"tiny-deepseek-v2-v{s.vocab_size}-h{s.hidden_size}-i{s.intermediate_size}"
            f"-l{s.num_hidden_layers}-a{s.num_attention_heads}-r{s.kv_lora_rank}"
            f"-p{s.qk_rope_head_dim}-n{s.qk_nope_head_dim}-v{s.v_head_dim}-s{s.seed}"
        )

    def config(self) -> dict[str, object]:
        return {
            "architectures": ["DeepseekV2ForCausalLM"],
            "model_type": "deepseek_v2",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
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
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "tie_word_embeddings": False,
            "dtype": "float32",
            "use_cache": True,
            "vocab_size": self.vocab_size,
        }

    def tensor_shapes(self) -> Shapes:
        h, heads, rank = self.hidden_size, self.num_attention_heads, self.kv_lora_rank
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        shapes: Shapes = [("model.embed_tokens.weight", (self.vocab_size, h))]
        for layer in range(self.num_hidden_layers):
            p = f"model.layers.{layer}"
            a = f"{p}.self_attn"
            shapes += [
                (f"{p}.input_layernorm.weight", (h,)),
                (f"{a}.q_proj.weight", (heads * qk, h)),
                (f"{a}.kv_a_proj_with_mqa.weight", (rank + self.qk_rope_head_dim, h)),
                (f"{a}.kv_a_layernorm.weight", (rank,)),
                (
                    f"{a}.kv_b_proj.weight",
                    (heads * (self.qk_nope_head_dim + self.v_head_dim), rank),
                ),
                (f"{a}.o_proj.weight", (h, heads * self.v_head_dim)),
                (f"{p}.post_attention_layernorm.weight", (h,)),
            ]
            shapes += mlp(p, h, self.intermediate_size)
        shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (self.vocab_size, h))]
        return shapes
