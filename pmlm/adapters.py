"""Low-rank adapters (LoRA) in an encoder, through ``peft``: put them in (``attach``), read and load their weights
(``AdapterWeights``, the part of a fine-tuned run that holds them), and fold them into the encoder's own weights
(``merge``).

``peft.inject_adapter_in_model`` replaces each targeted ``nn.Linear`` of the encoder's trunk (``model.encoder``:
our ``Encoder``, or the ``EsmTrunk`` around ``transformers``' EsmModel) by peft's LoRA layer, which computes
``W x + b + (alpha / r) B A Dropout(x)`` with ``A`` (r x in) drawn as Kaiming-uniform and ``B`` (out x r) zero, so the
adapted encoder starts equal to the pre-trained one. peft marks only the adapters trainable; the encoder's own weights
stay as pre-trained. The heads (token, pair) are never adapted: they live outside the trunk.

What a run saves of them is ``AdapterWeights``' state: the A and B matrices of each adapted layer, under the layer's
path in the trunk ("/" for "."), e.g. ``layers/0/attn/qkv.lora_A.default.weight``.

``peft`` is imported inside the functions that need it: it imports ``transformers`` (about 2 s of start-up), which a
run without adapters never needs.
"""

from __future__ import annotations

from torch import nn

from pmlm.config.finetuning import AdapterConfig
from pmlm.errors import ConfigError

# the attention projections of each encoder family: what ``targets: auto`` adapts
AUTO_TARGETS = {
    "pmlm": ("qkv", "proj"),
    "esm": ("query", "key", "value", "attention.output.dense"),
}
ADAPTER_NAME = "default"  # peft's name for the one adapter a layer holds


def trunk_of(encoder: nn.Module) -> nn.Module:
    """The module adapters go in: the encoder model's Transformer trunk (not its heads)."""
    return encoder.encoder


def family(encoder: nn.Module) -> str:
    """``esm`` for an ESM checkpoint run by transformers (pmlm.hf_esm), else ``pmlm``."""
    return "esm" if hasattr(trunk_of(encoder), "esm") else "pmlm"


def linear_names(trunk: nn.Module) -> list[str]:
    """Paths of the trunk's linear layers."""
    return [name for name, module in trunk.named_modules() if isinstance(module, nn.Linear)]


def layer_kinds(names: list[str]) -> list[str]:
    """The layer paths without the stack's prefix (``layers.0.attn.qkv`` -> ``attn.qkv``): the names a target can
    take."""
    kinds = set()
    for name in names:
        parts = name.split(".")
        numbers = [i for i, part in enumerate(parts) if part.isdigit()]
        kinds.add(".".join(parts[numbers[-1] + 1 :]) if numbers else name)
    return sorted(kinds)


def resolve_targets(cfg: AdapterConfig, encoder: nn.Module) -> tuple[str, ...]:
    """The layer names ``cfg.targets`` means on ``encoder`` (``auto`` -> its family's attention projections), each
    checked to match at least one of the trunk's linear layers (one line naming the layers it has)."""
    targets = AUTO_TARGETS[family(encoder)] if cfg.targets == "auto" else tuple(cfg.targets)
    names = linear_names(trunk_of(encoder))
    for target in targets:
        if not any(name == target or name.endswith("." + target) for name in names):
            raise ConfigError(
                f"adapter.targets: the encoder has no linear layer named {target!r}; its linear layers, per "
                f"Transformer layer: {', '.join(layer_kinds(names))}"
            )
    return targets


def attach(encoder: nn.Module, cfg: AdapterConfig) -> AdapterWeights:
    """Put LoRA adapters per ``cfg`` into ``encoder``'s trunk (in place); returns the module holding their weights.
    The encoder's own parameters no longer require gradients."""
    # peft imports transformers (module docstring): only runs with an adapter pay for it
    from peft import LoraConfig, inject_adapter_in_model

    targets = resolve_targets(cfg, encoder)
    config = LoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(targets), bias="none"
    )
    inject_adapter_in_model(config, trunk_of(encoder), adapter_name=ADAPTER_NAME)
    for p in encoder.parameters():
        p.requires_grad_(False)
    weights = AdapterWeights(encoder)
    for p in weights.parameters():
        p.requires_grad_(True)
    return weights


def lora_layers(encoder: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path in the trunk, peft LoRA layer) of every adapted layer."""
    # imported here for the reason the module docstring gives
    from peft.tuners.lora import LoraLayer

    return [(name, m) for name, m in trunk_of(encoder).named_modules() if isinstance(m, LoraLayer)]


class AdapterWeights(nn.ModuleDict):
    """The adapters' A and B matrices, keyed by their layer's path ("/" for "."): the trainable part a run saves
    (module docstring). Holds the same modules as the encoder, so loading a state here loads the adapters."""

    def __init__(self, encoder: nn.Module):
        super().__init__(
            {
                name.replace(".", "/"): nn.ModuleDict({"lora_A": layer.lora_A, "lora_B": layer.lora_B})
                for name, layer in lora_layers(encoder)
            }
        )


def merge(encoder: nn.Module) -> nn.Module:
    """Fold every adapter into its layer's weight (W + (alpha / r) B A) and put the plain layer back: the encoder
    computes what the adapted one did, with its own parameter names and no adapters (in place; returned)."""
    trunk = trunk_of(encoder)
    for name, layer in lora_layers(encoder):
        layer.merge(safe_merge=True)  # safe: refuses a merge whose weights are no longer finite
        parent_name, _, child = name.rpartition(".")
        setattr(trunk.get_submodule(parent_name) if parent_name else trunk, child, layer.get_base_layer())
    return encoder


def adapter_parameters(weights: AdapterWeights) -> int:
    return sum(p.numel() for p in weights.parameters())
