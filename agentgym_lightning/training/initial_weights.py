"""The weights a run starts from (``init_from``): another run's trained weights instead of the model's own.

``train --init-from RUN`` starts RL where an SFT run (or any run) ended: ``RUN`` is a run folder
(its ``final/`` model when it has one, else its newest intact checkpoint), a ``final/`` folder, or
one checkpoint folder. What it holds decides how it is loaded:

* **full weights** (``model.safetensors``) — loaded into the base model before any LoRA is added,
  so a LoRA run trains an adapter on top of them;
* **one LoRA adapter** (a checkpoint's ``adapter.safetensors``, ``final/adapter_model.safetensors``)
  — loaded into the run's adapter (the same ``lora_r`` and target modules), or into every agent's
  adapter under ``lora_per_agent``;
* **an adapter per agent** (``lora_per_agent``'s checkpoint or ``final/adapters/<name>/``) — each
  into the adapter of the same name.

Only weights are taken: the optimizer, scheduler and step start afresh (``--resume`` is for
continuing one run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym_lightning.training.checkpoint import find_checkpoint, load_full_weights, read_weights, weights_file

__all__ = ["InitialWeights", "find_initial_weights"]

_PEFT_FILE = "adapter_model.safetensors"


@dataclass
class InitialWeights:
    """Where a run's starting weights are and what they are (see the module docstring)."""

    source: Path
    #: ``full``, ``adapter`` (one LoRA adapter) or ``adapters`` (one per agent).
    kind: str
    #: The weights file (``full``, ``adapter`` from a checkpoint folder or ``final/``).
    file: Path | None = None
    #: Each agent adapter's file (``adapters`` from ``final/adapters/<name>/``).
    adapter_files: dict[str, Path] = field(default_factory=dict)

    @property
    def holds_adapters(self) -> bool:
        """Whether these are LoRA adapter weights (one adapter or one per agent), not full weights."""
        return self.kind != "full"

    def load_base(self, model: Any) -> None:
        """Full weights into ``model`` (before LoRA is added); nothing for adapters."""
        if not self.holds_adapters:
            assert self.file is not None
            load_full_weights(model, read_weights(self.file), self.source)

    def load_adapters(self, model: Any, *, peft: bool, adapters: Sequence[str] | None = None) -> None:
        """Adapter weights into ``model``'s LoRA adapter (``adapters``: each agent's); nothing for
        full weights. ``ValueError`` when the run has no adapter to take them."""
        if not self.holds_adapters:
            return
        if not peft:
            raise ValueError(
                f"init_from {self.source} holds LoRA adapter weights, not full weights: train with LoRA (--lora) "
                "with the same lora_r and target modules, or start from a full fine-tune"
            )
        from peft import set_peft_model_state_dict

        if self.kind == "adapter":
            assert self.file is not None
            saved = read_weights(self.file)
            prefixed = {k.split("/", 1)[0] for k in saved if "/" in k}
            if prefixed:  # a lora_per_agent checkpoint: each key is <adapter>/<key>
                self.kind, self.adapter_files = "adapters", {}
                return self._load_each(model, {n: {k[len(n) + 1 :]: v for k, v in saved.items() if k.startswith(f"{n}/")} for n in prefixed}, adapters)
            for name in adapters or [None]:
                _set(set_peft_model_state_dict, model, saved, name, self.source)
            return
        self._load_each(model, {name: read_weights(path) for name, path in self.adapter_files.items()}, adapters)

    def _load_each(self, model: Any, saved: dict[str, dict[str, Any]], adapters: Sequence[str] | None) -> None:
        from peft import set_peft_model_state_dict

        if not adapters:
            if len(saved) != 1:
                raise ValueError(
                    f"init_from {self.source} holds an adapter per agent ({', '.join(sorted(saved))}): start a lora_per_agent "
                    "run with the same adapter names from it"
                )
            _set(set_peft_model_state_dict, model, next(iter(saved.values())), None, self.source)
            return
        missing = [name for name in adapters if name not in saved]
        if missing:
            raise ValueError(f"init_from {self.source} holds no adapter named {', '.join(missing)} (it has {', '.join(sorted(saved))})")
        for name in adapters:
            _set(set_peft_model_state_dict, model, saved[name], name, self.source)


def _set(setter: Any, model: Any, weights: dict[str, Any], name: str | None, source: Path) -> None:
    result = setter(model, weights, adapter_name=name) if name is not None else setter(model, weights)
    unexpected = [k for k in getattr(result, "unexpected_keys", None) or [] if "lora_" in k]
    if unexpected:
        raise ValueError(f"init_from {source}: its adapter does not fit this run's LoRA (unexpected {unexpected[:3]}): use its lora_r and target modules")


def find_initial_weights(path: str | Path) -> InitialWeights:
    """The starting weights at ``path``: a run folder (``final/`` first, else its newest intact
    checkpoint), a ``final/`` folder or one checkpoint folder."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"init_from {path}: no such run, final/ or checkpoint folder")
    if (path / "final").is_dir():
        path = path / "final"
    for peft, kind in ((False, "full"), (True, "adapter")):
        if (path / weights_file(peft)).is_file():  # a checkpoint folder, or a final/ that links one
            return InitialWeights(path, kind, file=path / weights_file(peft))
    if (path / _PEFT_FILE).is_file():
        return InitialWeights(path, "adapter", file=path / _PEFT_FILE)
    if (path / "adapters").is_dir():
        files = {p.parent.name: p for p in sorted((path / "adapters").glob(f"*/{_PEFT_FILE}"))}
        if files:
            return InitialWeights(path, "adapters", adapter_files=files)
    checkpoint = find_checkpoint(path)  # a run folder without final/: its newest intact checkpoint
    return find_initial_weights(checkpoint)
