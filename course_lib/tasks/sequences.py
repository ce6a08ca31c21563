"""A variable-length task for a tiny transformer: sums written as characters (notebooks 03, 07).

    "12+345=357$"   the model reads it left to right; only "357$" is scored

    from course_lib.tasks.sequences import global_batch, decode
    batch = global_batch(seed=0, step=0, size=8)    # batch.inputs, batch.targets: (8, 12)
    batch.num_targets                               # scored tokens in the whole batch
    decode(batch.inputs[0])                         # "12+345=357" (padding dropped)

Every example is drawn from ``(seed, step)`` alone, so a global batch holds the same examples
however a run splits it between processes and micro-steps. Answers have different lengths, so
micro-batches hold different numbers of scored tokens: the reason token-count normalisation
matters (notebook 03's pitfalls lab).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

VOCAB = "0123456789+=$_"  # digits, plus, equals, end of answer, padding
PAD = VOCAB.index("_")  # fills every example up to the same length
END = VOCAB.index("$")  # ends each answer, so the model learns where an answer stops
IGNORE = -100  # target value that F.cross_entropy(ignore_index=-100) skips
_TO_ID = {ch: i for i, ch in enumerate(VOCAB)}


@dataclass(frozen=True)
class TokenBatch:
    """Examples as token ids; row ``i`` of both tensors is one example."""

    inputs: torch.Tensor  # (batch, length) token ids the model reads
    targets: torch.Tensor  # (batch, length) the next token, IGNORE where nothing is scored

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def __getitem__(self, index: slice) -> TokenBatch:
        if not isinstance(index, slice):
            raise TypeError("index a TokenBatch with a slice, e.g. batch[0:8], to keep a batch")
        return TokenBatch(self.inputs[index], self.targets[index])

    @property
    def num_targets(self) -> int:
        """Scored tokens in this batch: the denominator of its mean loss."""
        return int(self.target_counts().sum())

    def target_counts(self) -> torch.Tensor:
        """Scored tokens of each example, shape (batch,)."""
        return (self.targets != IGNORE).sum(dim=1)

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(self.inputs.to(device), self.targets.to(device))


def encode(text: str) -> list[int]:
    """Characters to token ids: ``encode("1+2=3$") == [1, 10, 2, 11, 3, 12]``."""
    unknown = sorted(set(text) - set(VOCAB))
    if unknown:
        raise ValueError(f"characters {unknown} are not in the vocabulary {VOCAB!r}")
    return [_TO_ID[ch] for ch in text]


def decode(ids: Sequence[int] | torch.Tensor) -> str:
    """Token ids back to characters, padding dropped."""
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
    return "".join(VOCAB[i] for i in ids if i != PAD)


def input_length(max_digits: int) -> int:
    """Length of every input row: "ddd+ddd=dddd$" has 3 * max_digits + 4 characters, and the
    model reads all but the last one."""
    return 3 * max_digits + 3


def sum_text(a: int, b: int) -> str:
    """One example as text: ``sum_text(12, 345) == "12+345=357$"``."""
    return f"{a}+{b}={a + b}$"


def texts_to_batch(texts: Sequence[str], max_digits: int) -> TokenBatch:
    """Pad, shift by one and mask: the model at position j predicts character j + 1, and only
    characters after the "=" (the answer and its end mark) are scored."""
    length = input_length(max_digits)
    inputs = torch.full((len(texts), length), PAD, dtype=torch.long)  # (batch, length)
    targets = torch.full((len(texts), length), IGNORE, dtype=torch.long)  # (batch, length)
    for row, text in enumerate(texts):
        ids = encode(text)
        if len(ids) > length + 1:
            raise ValueError(f"{text!r} is longer than max_digits={max_digits} allows")
        equals = text.index("=")
        inputs[row, : len(ids) - 1] = torch.tensor(ids[:-1])
        # position j predicts ids[j + 1]; from the "=" on, that is an answer character
        targets[row, equals : len(ids) - 1] = torch.tensor(ids[equals + 1 :])
    return TokenBatch(inputs, targets)


def batch_generator(seed: int, step: int) -> torch.Generator:
    """A generator that depends on (seed, step) only: any rank can rebuild any step's batch."""
    if seed < 0 or step < 0:
        raise ValueError(f"seed and step must be >= 0, got seed={seed}, step={step}")
    # distinct for every (seed, step) with step < 1_000_003, far more steps than any run here
    return torch.Generator().manual_seed((seed * 1_000_003 + step) % 2**63)


def draw_operands(generator: torch.Generator, size: int, max_digits: int) -> list[tuple]:
    """``size`` pairs (a, b); the number of digits of each is uniform in 1..max_digits, so
    short and long sums are equally common and answer lengths vary."""
    digits = torch.randint(1, max_digits + 1, (size, 2), generator=generator)  # (size, 2)
    low = torch.where(digits == 1, 0, 10 ** (digits - 1))  # smallest number with that many
    span = 10**digits - low
    fraction = torch.rand((size, 2), generator=generator, dtype=torch.float64)
    numbers = low + (fraction * span).long()  # (size, 2), uniform within each digit count
    return [(int(a), int(b)) for a, b in numbers.tolist()]


def global_batch(seed: int, step: int, size: int, max_digits: int = 3) -> TokenBatch:
    """The whole batch of optimizer step ``step``: the same examples for any split of the run."""
    if size < 1:
        raise ValueError(f"a batch needs at least one example, got size={size}")
    if not 1 <= max_digits <= 6:
        raise ValueError(f"max_digits must be between 1 and 6, got {max_digits}")
    pairs = draw_operands(batch_generator(seed, step), size, max_digits)
    return texts_to_batch([sum_text(a, b) for a, b in pairs], max_digits)


@torch.no_grad()
def greedy_answer(model: torch.nn.Module, a: int, b: int, max_digits: int = 3) -> str:
    """Let a trained model answer "a+b=" one character at a time (its most likely token)."""
    device = next(model.parameters()).device
    ids = encode(f"{a}+{b}=")
    answer = ""
    while len(ids) < input_length(max_digits):
        logits = model(torch.tensor([ids], device=device))  # (1, len(ids), vocab)
        next_id = int(logits[0, -1].argmax())
        if next_id in (END, PAD):
            break
        answer += VOCAB[next_id]
        ids.append(next_id)
    return answer
