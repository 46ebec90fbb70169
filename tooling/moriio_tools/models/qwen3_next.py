"""A tiny Qwen3-Next (``Qwen3NextForCausalLM``): Gated-DeltaNet and full-attention layers, MoE.

Three of every four layers are Gated-DeltaNet linear attention (a recurrent state and a
short convolution per request, which vLLM keeps in a cache group of its own), the fourth is
gated full attention over the KV cache; every layer's feed-forward is a mixture of experts
with a gated shared expert. The weight names are the Hugging Face checkpoint's: fused
``in_proj_qkvz`` / ``in_proj_ba`` with the key-head-interleaved layout, one tensor per
expert projection.

The decoder's RMSNorms scale by ``1 + weight`` ("zero-centered"), but the Gated-DeltaNet's
output norm (``linear_attn.norm``) scales by the weight itself, and the store writes one
value into every norm: weights of 1 scale the first by 2 and leave the second as is (0 would
silence every linear-attention layer). With N(0, 0.1) weights the mixers then outweigh the
token's own embedding, so outputs depend on the context.

vLLM's CPU Gated-DeltaNet kernels only run in bfloat16: the config says so, but the engine
flags have to as well (the tools pass ``--dtype float32`` to every engine). vLLM keeps each
linear-attention layer's state in one block of the attention layer's size: a 64-token block
of 2 KV heads of 256 (128 KiB) holds it (67 KiB with a float32 recurrent state, as on CPUs
with AVX512-BF16), so vLLM serves 4 KV cache groups (3 Gated-DeltaNet, 1 full attention) of
64-token blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from moriio_tools.models.configs import decoder_config, model_dirname
from moriio_tools.models.shapes import Shapes, decoder

FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"


@dataclass(frozen=True, slots=True)
class TinyQwen3Next:
    """Shape of the model: every ``full_attention_interval``-th layer is full attention
    (4 query heads with output gates, 2 KV heads of 256, a quarter of each rotated), the
    others are Gated-DeltaNet (2 key heads, 4 value heads of 64); each layer routes a token
    to ``num_experts_per_tok`` of ``num_experts`` experts and its shared expert.

    ``intermediate_size`` would be a dense MLP's, which no layer has (it only names the
    directory and fills the config key).
    """

    vocab_size: int = 1000
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 4
    full_attention_interval: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 256
    partial_rotary_factor: float = 0.25
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 64
    linear_value_head_dim: int = 64
    linear_conv_kernel_dim: int = 4
    num_experts: int = 4
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64
    shared_expert_intermediate_size: int = 128
    max_position_embeddings: int = 1024
    seed: int = 0
    std: float = 0.1
    norm_weight: float = 1.0

    @property
    def layer_types(self) -> list[str]:
        """Each layer's kind: linear attention, but full attention every interval."""
        return [
            LINEAR_ATTENTION if (i + 1) % self.full_attention_interval else FULL_ATTENTION
            for i in range(self.num_hidden_layers)
        ]

    @property
    def dirname(self) -> str:
        s = self
        sizes = (
            f"-f{s.full_attention_interval}-kv{s.num_key_value_heads}-d{s.head_dim}"
            f"-r{s.partial_rotary_factor:g}"
            f"-lk{s.linear_num_key_heads}x{s.linear_key_head_dim}"
            f"-lv{s.linear_num_value_heads}x{s.linear_value_head_dim}-c{s.linear_conv_kernel_dim}"
            f"-e{s.num_experts}k{s.num_experts_per_tok}-m{s.moe_intermediate_size}"
            f"-sh{s.shared_expert_intermediate_size}-n{s.norm_weight:g}"
        )
        return model_dirname("qwen3-next", self, sizes)

    def config(self) -> dict[str, object]:
        rotary = self.partial_rotary_factor
        return {
            **decoder_config(self, "Qwen3NextForCausalLM", "qwen3_next"),
            "dtype": "bfloat16",
            "head_dim": self.head_dim,
            "num_key_value_heads": self.num_key_value_heads,
            "partial_rotary_factor": rotary,
            "rope_parameters": {
                "rope_theta": 10000.0,
                "rope_type": "default",
                "partial_rotary_factor": rotary,
            },
            "layer_types": self.layer_types,
            "full_attention_interval": self.full_attention_interval,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "shared_expert_intermediate_size": self.shared_expert_intermediate_size,
            "norm_topk_prob": True,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
        }

    def tensor_shapes(self) -> Shapes:
        return decoder(self, self._mixer, self._experts)

    def _mixer(self, prefix: str) -> Shapes:
        layer = int(prefix.rsplit(".", 1)[1])
        if self.layer_types[layer] == FULL_ATTENTION:
            return self._full_attention(prefix)
        return self._linear_attention(prefix)

    def _full_attention(self, prefix: str) -> Shapes:
        """q_proj holds each head's query and its output gate, side by side."""
        h, d = self.hidden_size, self.head_dim
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        a = f"{prefix}.self_attn"
        return [
            (f"{a}.q_proj.weight", (2 * q, h)),
            (f"{a}.k_proj.weight", (kv, h)),
            (f"{a}.v_proj.weight", (kv, h)),
            (f"{a}.o_proj.weight", (h, q)),
            (f"{a}.q_norm.weight", (d,)),
            (f"{a}.k_norm.weight", (d,)),
        ]

    def _linear_attention(self, prefix: str) -> Shapes:
        """Gated DeltaNet: fused projections, a depthwise convolution over q, k and v, the
        per-value-head decay (``A_log``, ``dt_bias``) and a gated output norm."""
        h = self.hidden_size
        key = self.linear_num_key_heads * self.linear_key_head_dim
        value = self.linear_num_value_heads * self.linear_value_head_dim
        v_heads = self.linear_num_value_heads
        a = f"{prefix}.linear_attn"
        return [
            (f"{a}.in_proj_qkvz.weight", (2 * key + 2 * value, h)),
            (f"{a}.in_proj_ba.weight", (2 * v_heads, h)),
            (f"{a}.conv1d.weight", (2 * key + value, 1, self.linear_conv_kernel_dim)),
            (f"{a}.dt_bias", (v_heads,)),
            (f"{a}.A_log", (v_heads,)),
            (f"{a}.norm.weight", (self.linear_value_head_dim,)),
            (f"{a}.out_proj.weight", (h, value)),
        ]

    def _experts(self, prefix: str) -> Shapes:
        """The router, every routed expert, the shared expert and its gate."""
        h, m, s = self.hidden_size, self.moe_intermediate_size, self.shared_expert_intermediate_size
        p = f"{prefix}.mlp"
        shapes: Shapes = [(f"{p}.gate.weight", (self.num_experts, h))]
        for e in range(self.num_experts):
            shapes += [
                (f"{p}.experts.{e}.gate_proj.weight", (m, h)),
                (f"{p}.experts.{e}.up_proj.weight", (m, h)),
                (f"{p}.experts.{e}.down_proj.weight", (h, m)),
            ]
        return [
            *shapes,
            (f"{p}.shared_expert.gate_proj.weight", (s, h)),
            (f"{p}.shared_expert.up_proj.weight", (s, h)),
            (f"{p}.shared_expert.down_proj.weight", (h, s)),
            (f"{p}.shared_expert_gate.weight", (1, h)),
        ]
