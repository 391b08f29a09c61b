"""A request on its way through the ``hf`` decode: its row, how its tokens are drawn, when it ends.

The rows of one batch may sample differently: each row's :class:`Sampling` picks its
:class:`Sampler`, and a seeded, sampled row draws from a torch generator of its own
(:func:`row_generator`), so its tokens do not depend on its batch-mates.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from agentgym_lightning.llm import ChatRequest, Completion

__all__ = ["Row", "Sampling", "GREEDY", "Entry", "Sampler", "row_generator", "ended"]


@dataclass
class Row:
    """One planned request: its prompt ids and the limits its completion stops at."""

    index: int  # position in the caller's request list
    request: ChatRequest
    prompt_ids: list[int]
    max_tokens: int
    stops: tuple[str, ...]
    adapter: str | None = None  # the LoRA adapter it is generated with (None: the active one)
    stop_ids: frozenset[int] = frozenset()  # the request's own stop_token_ids, beside the policy's


@dataclass(frozen=True)
class Sampling:
    """How a row's tokens are drawn: greedily, or sampled at ``temperature`` within ``top_p``."""

    do_sample: bool
    temperature: float
    top_p: float


#: Greedy decoding ignores temperature, top-p and seed: every greedy row samples alike.
GREEDY = Sampling(False, 0.0, 1.0)


@dataclass
class Entry:
    """A request in the step scheduler: its row, its sampling, its future and what it drew so far."""

    row: Row
    sampling: Sampling
    future: Future[Completion]
    generator: Any = None  # the row's own torch generator (seeded, sampled rows)
    across_calls: bool = True  # takes from and leaves keys and values in the prefix cache (submit's calls)
    version: Any = None  # the weights it was prefilled with (HFPolicy.weights_version)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class Sampler:
    """Draws a batch's next tokens and their logprobs under the distribution each was drawn from.

    Temperature and top-p are transformers' own warpers; what is recorded is ``log_softmax`` of
    the warped fp32 logits (of the raw logits for greedy decoding, which takes the argmax). A row
    whose request has a ``seed`` draws from a generator of its own (:func:`row_generator`), so it
    samples the same tokens whatever shares its batch and whenever other rows end; the other rows
    draw from torch's global generator."""

    def __init__(self, sampling: Sampling) -> None:
        from transformers import TemperatureLogitsWarper, TopPLogitsWarper

        self.do_sample = sampling.do_sample
        self.warpers: list[Any] = []
        if sampling.do_sample and sampling.temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(sampling.temperature))
        if sampling.do_sample and sampling.top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=sampling.top_p))

    def __call__(self, logits: Any, generators: Sequence[Any]) -> tuple[Any, Any]:
        """The next token of each row of ``logits`` (``generators``: each row's, ``None`` for the
        global one) and its logprob."""
        import torch

        scores = logits.float()
        for warper in self.warpers:
            scores = warper(None, scores)
        logprobs = torch.log_softmax(scores, dim=-1)
        if not self.do_sample:
            chosen = scores.argmax(dim=-1)
        else:
            probs = logprobs.exp()
            chosen = torch.empty(len(generators), dtype=torch.long, device=scores.device)
            unseeded = [b for b, g in enumerate(generators) if g is None]
            for b, generator in enumerate(generators):
                if generator is not None:
                    chosen[b] = torch.multinomial(probs[b], 1, generator=generator)[0]
            if unseeded:
                chosen[unseeded] = torch.multinomial(probs[unseeded], 1).squeeze(1)
        return chosen, logprobs.gather(1, chosen[:, None]).squeeze(1)


def row_generator(sampling: Sampling, row: Row, device: Any) -> Any:
    """The torch generator a sampled, seeded row draws from (``None``: the global one)."""
    import torch

    if not sampling.do_sample or row.request.sampling.seed is None:
        return None  # (greedy decoding draws nothing: no generator to seed)
    return torch.Generator(device=device).manual_seed(int(row.request.sampling.seed))


def ended(row: Row, tokens: list[int], tokenizer: Any, stop_token_ids: frozenset[int]) -> tuple[str, str | None] | None:
    """``(finish_reason, text)`` once ``row`` has ended with its last token (``text``: the answer
    cut before a stop string; ``None`` to decode the ids), else ``None``. ``stop_token_ids``: the
    policy's (EOS and its stop tokens), beside the row's own."""
    if tokens[-1] in stop_token_ids or tokens[-1] in row.stop_ids:
        return "stop", None
    if row.stops:
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        found = [text.find(s) for s in row.stops if s in text]
        if found:
            return "stop", text[: min(found)]
    if len(tokens) >= row.max_tokens:
        return "length", None
    return None
