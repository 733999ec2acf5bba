"""A small self-attention classifier over token sequences."""

import torch
import torch.nn.functional as F
from jsonargparse.typing import PositiveInt, restricted_number_type
from lightning_kit.arguments import NumClasses, check_memory
from torch import nn

# A share of values dropped in training: all of them would leave nothing to learn from.
Dropout = restricted_number_type("Dropout", float, [(">=", 0), ("<", 1)])


def parameter_count(vocab_size: int, num_classes: int, max_len: int, d_model: int, num_layers: int) -> int:
    """The network's parameters: embeddings, ``num_layers`` blocks of about 12 d_model² each, and the head."""
    block = 12 * d_model**2 + 13 * d_model  # two layer norms, qkv, proj and the MLP, with their biases
    return (vocab_size + max_len) * d_model + num_layers * block + 2 * d_model + (d_model + 1) * num_classes


class SelfAttention(nn.Module):
    """Multi-head self-attention over a whole sequence (no causal mask)."""

    def __init__(self, d_model: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        assert d_model % num_heads == 0, f"d_model={d_model} must be divisible by num_heads={num_heads}"
        self.num_heads = num_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape  # (batch, seq, d_model)
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, heads, T, C // heads)
        q, k, v = (t.view(B, T, self.num_heads, C // self.num_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    """A pre-norm transformer block: attention, then a two-layer MLP, each residual."""

    def __init__(self, d_model: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, num_heads, dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model),
            nn.GELU(),
            nn.Linear(4 * d_model, d_model),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class AttentionClassifier(nn.Module):
    """Embeds tokens and their positions, applies attention blocks, and classifies the mean.

    Args:
        vocab_size: Distinct token ids (set by the data).
        num_classes: Outputs, one logit per class (set by the data).
        max_len: Longest sequence taken (set by the data's ``seq_len``).
        d_model: Width of the token representations; ``num_heads`` divides it.
        num_heads: Attention heads per block.
        num_layers: Attention blocks, at least 1.
        dropout: Share of attention weights and MLP outputs dropped in training, in [0, 1).

    What each argument accepts is in its type, which the command line checks where the value is given; what
    relates two of them is checked here, in a ValueError naming the arguments (the command line names their flags).
    """

    def __init__(
        self,
        vocab_size: PositiveInt = 16,
        num_classes: NumClasses = 2,
        max_len: PositiveInt = 32,
        d_model: PositiveInt = 64,
        num_heads: PositiveInt = 4,
        num_layers: PositiveInt = 2,
        dropout: Dropout = 0.0,
    ) -> None:
        if d_model % num_heads:
            raise ValueError(f"num_heads {num_heads} must divide d_model {d_model}")
        sizes = {"vocab_size": vocab_size, "num_classes": num_classes, "max_len": max_len, "d_model": d_model,
                 "num_layers": num_layers}  # fmt: skip
        check_memory(4 * parameter_count(**sizes), "the network", list(sizes), list(sizes.values()), ValueError)
        super().__init__()
        self.num_classes = num_classes
        self.max_len = max_len
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(max_len, d_model)
        # The seed's `torch.arange(seqlen)` case: position indices are not derived
        # from the input, so created in forward they would land on the CPU. As a
        # buffer they are built once and Lightning moves them with the model.
        self.register_buffer("positions", torch.arange(max_len), persistent=False)
        self.blocks = nn.Sequential(*(Block(d_model, num_heads, dropout) for _ in range(num_layers)))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Map ``(B, T)`` token ids to ``(B, classes)`` logits."""
        _, T = tokens.shape  # (batch, seq)
        assert self.max_len >= T, f"sequence length {T} exceeds max_len={self.max_len}"
        x = self.token_embedding(tokens) + self.position_embedding(self.positions[:T])
        x = self.norm(self.blocks(x))
        return self.head(x.mean(dim=1))
