"""The sums task: deterministic from (seed, step), valid examples, answers scored, lengths vary."""

import pytest
import torch

from course_lib.tasks.sequences import (
    END,
    IGNORE,
    PAD,
    VOCAB,
    TokenBatch,
    decode,
    encode,
    global_batch,
    input_length,
    texts_to_batch,
)


def test_same_seed_and_step_give_the_same_batch_and_others_differ():
    a, b = global_batch(3, 7, 16), global_batch(3, 7, 16)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, global_batch(3, 8, 16).inputs)  # next step: new examples
    assert not torch.equal(a.inputs, global_batch(4, 7, 16).inputs)  # other seed: new examples


def test_batch_does_not_depend_on_the_global_random_state():
    torch.manual_seed(1)
    first = global_batch(0, 2, 8).inputs
    torch.manual_seed(2)
    torch.rand(100)
    assert torch.equal(first, global_batch(0, 2, 8).inputs)


@pytest.mark.parametrize("max_digits", [1, 3])
def test_every_example_is_a_correct_sum_scored_on_its_answer(max_digits):
    batch = global_batch(0, 0, 64, max_digits=max_digits)
    assert batch.inputs.shape == (64, input_length(max_digits)) == batch.targets.shape
    for row in range(len(batch)):
        text = decode(batch.inputs[row])
        left, answer = text.split("=")
        a, b = left.split("+")
        assert int(a) + int(b) == int(answer)
        assert 1 <= len(a) <= max_digits and 1 <= len(b) <= max_digits
        scored = batch.targets[row][batch.targets[row] != IGNORE].tolist()
        assert decode(scored) == answer + "$"  # the answer and its end mark, nothing else
        assert scored[-1] == END
        # the first scored position is the "=": it predicts the first answer digit
        first = int((batch.targets[row] != IGNORE).nonzero()[0])
        assert VOCAB[int(batch.inputs[row, first])] == "="


def test_lengths_vary_so_token_counts_differ_between_examples():
    batch = global_batch(0, 0, 256)
    counts = batch.target_counts()
    assert len(set(counts.tolist())) >= 3  # answers of several lengths
    assert batch.num_targets == int(counts.sum())
    digits = {len(decode(row).split("+")[0]) for row in batch.inputs}
    assert digits == {1, 2, 3}  # short and long operands both appear
    assert (batch.inputs == PAD).any()  # shorter examples are padded


def test_encode_decode_and_clear_errors():
    assert encode("1+2=3$") == [1, 10, 2, 11, 3, 12]
    assert decode(encode("12+345=357$")) == "12+345=357$"
    with pytest.raises(ValueError, match="not in the vocabulary"):
        encode("1*2")
    with pytest.raises(ValueError, match="at least one example"):
        global_batch(0, 0, 0)
    with pytest.raises(ValueError, match="longer than max_digits"):
        texts_to_batch(["1234+5678=6912$"], max_digits=3)


def test_token_batch_slices_and_moves():
    batch = global_batch(0, 0, 10)
    part = batch[2:5]
    assert isinstance(part, TokenBatch) and len(part) == 3
    assert torch.equal(part.targets, batch.targets[2:5])
    assert part.to("cpu").num_targets == part.num_targets
    with pytest.raises(TypeError, match="slice"):
        batch[0]
