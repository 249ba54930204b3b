"""The sampler on plain tensors: each sampling parameter does what the OpenAI/vLLM semantics
say, over a batch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trio_llm.engine.step.sampler import Sampler, SamplingTensors, compute_logprobs, row_max
from trio_llm.engine.step.sequence import DEAD_END, Sequence
from trio_llm.engine.step.token_bans import TokenBans
from trio_llm.sampling_params import SamplingParams

EOS = 2
CPU = torch.device("cpu")


def seqs_for(
    *params: SamplingParams, outputs: list[int] | None = None, prompt: tuple[int, ...] = (1,)
) -> list[Sequence]:
    out = []
    for i, p in enumerate(params):
        seq = Sequence(request_id=str(i), token_ids=list(prompt), params=p, max_tokens=100)
        seq.token_ids += outputs or []
        out.append(seq)
    return out


def sample(logits: torch.Tensor, seqs: list[Sequence], seed: int = 0) -> list[int]:
    st = SamplingTensors.build(seqs, frozenset({EOS}), logits.shape[1], CPU)
    return Sampler(seed, CPU)(logits, st).token_ids


def probs_logits(*probs: float, rows: int = 1) -> torch.Tensor:
    return torch.tensor([math.log(p) for p in probs]).repeat(rows, 1)


def test_greedy_takes_the_argmax_per_row() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 1.0]])
    assert sample(
        logits, seqs_for(SamplingParams(temperature=0), SamplingParams(temperature=0))
    ) == [1, 0]


def test_greedy_rows_stay_greedy_in_a_sampled_batch() -> None:
    logits = probs_logits(0.4, 0.35, 0.25, rows=200)
    params = [SamplingParams(temperature=0) if i % 2 else SamplingParams() for i in range(200)]
    tokens = sample(logits, seqs_for(*params))
    assert all(t == 0 for t in tokens[1::2])
    assert len(set(tokens[0::2])) == 3  # the sampled rows spread over every token


def test_top_k_keeps_the_k_most_likely() -> None:
    logits = probs_logits(0.1, 0.4, 0.3, 0.2, rows=400)
    tokens = sample(logits, seqs_for(*[SamplingParams(top_k=2)] * 400))
    assert set(tokens) == {1, 2}


def test_top_k_and_disabled_rows_mix() -> None:
    logits = probs_logits(0.1, 0.4, 0.3, 0.2, rows=400)
    params = [SamplingParams(top_k=1) if i % 2 else SamplingParams(top_k=0) for i in range(400)]
    tokens = sample(logits, seqs_for(*params))
    assert set(tokens[1::2]) == {1}
    assert set(tokens[0::2]) == {0, 1, 2, 3}


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = probs_logits(0.5, 0.3, 0.15, 0.05, rows=400)
    tokens = sample(logits, seqs_for(*[SamplingParams(top_p=0.7)] * 400))
    assert set(tokens) == {0, 1}


def test_top_k_and_top_p_together() -> None:
    logits = probs_logits(0.05, 0.5, 0.3, 0.15, rows=400)
    tokens = sample(logits, seqs_for(*[SamplingParams(top_k=3, top_p=0.9)] * 400))
    assert set(tokens) == {1, 2, 3}
    tokens = sample(logits, seqs_for(*[SamplingParams(top_k=2, top_p=0.99)] * 400))
    assert set(tokens) == {1, 2}


def test_top_p_among_the_candidates_keeps_what_the_full_sort_keeps() -> None:
    """The nucleus found among the most likely NUCLEUS_CANDIDATES tokens, or by sorting the
    whole row where it reaches past them (flat rows), is the one the full sort finds."""
    from trio_llm.engine.step.sampler import _sorted_top_k_top_p, apply_top_k_top_p

    gen = torch.Generator().manual_seed(3)
    vocab = 5000
    scales = torch.tensor([8.0, 3.0, 1.0, 0.01, 5.0, 0.5, 2.0, 8.0])  # peaked ... nearly flat
    logits = torch.randn(len(scales), vocab, generator=gen) * scales[:, None]
    top_p = torch.tensor([0.9, 0.95, 0.5, 0.9, 1.0, 0.99, 0.7, 1.0])
    top_k = torch.tensor([0, 0, 0, 0, 40, 2000, 0, 0])
    got = apply_top_k_top_p(logits, top_k, top_p)
    k = torch.where(top_k > 0, top_k, vocab)
    want = _sorted_top_k_top_p(logits, k, top_p)
    assert torch.equal(got.isfinite(), want.isfinite())
    assert torch.equal(got[got.isfinite()], logits[got.isfinite()])
    assert torch.equal(got[7], logits[7])  # neither top-k nor top-p: untouched
    assert int(got[3].isfinite().sum()) > 1024  # the flat row's nucleus passed the candidates


def test_min_p_drops_tokens_below_a_fraction_of_the_top() -> None:
    logits = probs_logits(0.6, 0.3, 0.1, rows=400)
    tokens = sample(logits, seqs_for(*[SamplingParams(min_p=0.2)] * 400))
    assert set(tokens) == {0, 1}


def test_low_temperature_concentrates_high_temperature_spreads() -> None:
    logits = probs_logits(0.5, 0.3, 0.2, rows=600)
    cold = sample(logits, seqs_for(*[SamplingParams(temperature=0.05)] * 600))
    hot = sample(logits, seqs_for(*[SamplingParams(temperature=5.0)] * 600))
    assert cold.count(0) > 590
    assert 150 < hot.count(2) < 250  # close to uniform


def test_seeded_rows_repeat_and_unseeded_rows_do_not_disturb_them() -> None:
    logits = probs_logits(*[0.1] * 10, rows=3)
    seeded = SamplingParams(seed=42)

    def draw(batch: list[SamplingParams], engine_seed: int) -> list[int]:
        """The seeded row's token at each of 20 output positions."""
        sampler = Sampler(engine_seed, CPU)
        tokens = []
        for position in range(20):
            seqs = seqs_for(*batch, outputs=[11] * position)
            st = SamplingTensors.build(seqs, frozenset({EOS}), 10, CPU)
            tokens.append(sampler(logits[: len(seqs)], st).token_ids[batch.index(seeded)])
        return tokens

    alone = draw([seeded], 0)
    assert draw([SamplingParams(), seeded, SamplingParams()], 1) == alone
    assert len(set(alone)) > 1


def test_a_seeded_draw_depends_on_the_seed_and_output_position_alone() -> None:
    """A draft row samples a later output position than its sequence's last committed token:
    its draw is the one that position gets without drafts, however many rows the step has."""
    logits = probs_logits(*[0.1] * 10, rows=4)
    seeded = SamplingParams(seed=7)

    def token(seqs: list[Sequence], offsets: list[int], row: int) -> int:
        st = SamplingTensors.build(seqs, frozenset({EOS}), 10, CPU, draft_offsets=np.array(offsets))
        return Sampler(0, CPU)(logits[: len(seqs)], st).token_ids[row]

    # Output position 3: a sequence with 3 outputs, or one with 1 output and 2 draft rows.
    direct = token(seqs_for(seeded, outputs=[11, 12, 13]), [0], 0)
    drafted = seqs_for(seeded, outputs=[11]) * 3
    assert token(drafted, [0, 1, 2], 2) == direct
    # Positions and seeds each get their own stream.
    by_position = [token(seqs_for(seeded, outputs=[11] * p), [0], 0) for p in range(12)]
    other_seed = [
        token(seqs_for(SamplingParams(seed=8), outputs=[11] * p), [0], 0) for p in range(12)
    ]
    assert len(set(by_position)) > 1 and by_position != other_seed


def test_draws_follow_the_distribution_and_never_pick_a_zero_probability_token() -> None:
    """The inverse-CDF draw over many seeded rows: each token's share within a few standard
    errors of its probability (chi-square at p < 1e-6 would fail), the zero ones never."""
    probs = torch.tensor([0.5, 0.0, 0.2, 0.0, 0.25, 0.05])
    logits = torch.log(probs).repeat(20_000, 1)
    params = [SamplingParams(seed=i) for i in range(20_000)]
    tokens = torch.tensor(sample(logits, seqs_for(*params)))
    counts = torch.bincount(tokens, minlength=6).double()
    assert counts[1] == 0 and counts[3] == 0
    expected = probs.double() * len(tokens)
    kept = expected > 0
    chi2 = float((((counts - expected) ** 2)[kept] / expected[kept]).sum())
    assert chi2 < 30.0, (counts.tolist(), chi2)  # 3 degrees of freedom: p(chi2 > 30) ~ 1e-6


def test_logit_bias_moves_the_argmax() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, 0.5]])
    params = SamplingParams(temperature=0, logit_bias={3: 5.0})
    assert sample(logits, seqs_for(params)) == [3]


def test_min_tokens_masks_eos_and_stop_tokens_until_enough_tokens() -> None:
    logits = torch.tensor([[0.0, 0.0, 9.0, 0.0, 8.0, 1.0]])  # EOS (2) then stop token 4
    params = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[4])
    assert sample(logits, seqs_for(params, outputs=[11])) == [5]
    assert sample(logits, seqs_for(params, outputs=[11, 12, 13])) == [EOS]
    ignore = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[4], ignore_eos=True)
    assert sample(logits, seqs_for(ignore, outputs=[11])) == [EOS]


def test_penalties() -> None:
    base = torch.tensor([[1.0, 1.0, 1.0, 2.0, -1.0]])
    # Output tokens so far: 0 twice, 1 once; the prompt (token 4) does not count.
    outputs = [0, 0, 1]
    cases = {
        "presence": (SamplingParams(presence_penalty=0.6), [0.4, 0.4, 1.0, 2.0, -1.0]),
        "frequency": (SamplingParams(frequency_penalty=0.5), [0.0, 0.5, 1.0, 2.0, -1.0]),
    }
    for name, (params, expected) in cases.items():
        seqs = seqs_for(params, outputs=outputs, prompt=(4,))
        st = SamplingTensors.build(seqs, frozenset({EOS}), 5, CPU)
        logits = base.clone()
        from trio_llm.engine.step.sampler import apply_penalties

        apply_penalties(logits, st)
        assert logits[0].tolist() == pytest.approx(expected), name


def test_repetition_penalty_covers_prompt_and_output() -> None:
    from trio_llm.engine.step.sampler import apply_penalties

    seq = Sequence(
        request_id="r",
        token_ids=[3, 4],
        params=SamplingParams(repetition_penalty=2.0),
        max_tokens=9,
    )
    seq.token_ids.append(0)
    st = SamplingTensors.build([seq], frozenset({EOS}), 5, CPU)
    logits = torch.tensor([[1.0, 1.0, 1.0, 2.0, -1.0]])
    apply_penalties(logits, st)
    assert logits[0].tolist() == pytest.approx([0.5, 1.0, 1.0, 1.0, -2.0])


def test_penalized_and_plain_rows_in_one_batch() -> None:
    logits = torch.tensor([[3.0, 2.9, 0.0], [3.0, 2.9, 0.0]])
    seqs = seqs_for(
        SamplingParams(temperature=0, frequency_penalty=1.0),
        SamplingParams(temperature=0),
        outputs=[0],
    )
    assert sample(logits, seqs) == [1, 0]


def test_logprobs_of_the_chosen_token_and_the_top_alternatives() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, 1.0]])
    chosen = torch.tensor([2, 2])
    out = compute_logprobs(logits, chosen, [2, None])
    ref = logits.log_softmax(-1).tolist()
    first = out[0]
    assert first is not None and out[1] is None
    assert first.token_ids == [2, 1, 2]
    assert first.logprobs == pytest.approx([ref[0][2], ref[0][1], ref[0][2]])
    assert first.rank == 2


def test_sampler_returns_logprobs_of_the_raw_distribution() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    params = SamplingParams(temperature=0, logprobs=0, logit_bias={0: 10.0})
    st = SamplingTensors.build(seqs_for(params), frozenset({EOS}), 4, CPU)
    out = Sampler(0, CPU)(logits, st)
    assert out.token_ids == [0]
    assert out.logprobs is not None and out.logprobs[0] is not None
    assert out.logprobs[0].token_ids == [0]
    assert out.logprobs[0].logprobs == pytest.approx([logits.log_softmax(-1)[0, 0].item()])
    assert out.logprobs[0].rank == 3


def banned(*params: SamplingParams, outputs: list[int] | None = None, vocab: int = 5) -> list:
    """Sequences whose bans are built as the engine builds them when a request arrives."""
    seqs = seqs_for(*params, outputs=outputs)
    for seq in seqs:
        seq.bans = TokenBans.build(seq.params, vocab, CPU)
    return seqs


def test_requests_without_bans_build_none() -> None:
    assert TokenBans.build(SamplingParams(), 5, CPU) is None


def test_allowed_token_ids_restrict_only_the_rows_that_ask() -> None:
    logits = probs_logits(0.4, 0.3, 0.2, 0.05, 0.05, rows=400)
    params = [
        SamplingParams(allowed_token_ids=[2, 3]) if i % 2 else SamplingParams() for i in range(400)
    ]
    tokens = sample(logits, banned(*params))
    assert set(tokens[1::2]) == {2, 3}
    assert set(tokens[0::2]) == {0, 1, 2, 3, 4}
    greedy = SamplingParams(temperature=0, allowed_token_ids=[4, 3])
    assert sample(probs_logits(0.4, 0.3, 0.2, 0.06, 0.04), banned(greedy)) == [3]


def test_one_token_bad_words_are_never_sampled() -> None:
    logits = probs_logits(0.4, 0.3, 0.2, 0.05, 0.05, rows=400)
    params = [SamplingParams(bad_words_token_ids=[[0], [3]])] * 400
    assert set(sample(logits, banned(*params))) == {1, 2, 4}


def test_longer_bad_words_ban_their_last_token_after_their_prefix_in_the_output() -> None:
    greedy = SamplingParams(temperature=0, bad_words_token_ids=[[1, 2, 0], [4, 0]])
    logits = probs_logits(0.4, 0.3, 0.2, 0.06, 0.04, rows=1)
    # The output ends with [1, 2]: token 0 would complete the first word.
    assert sample(logits, banned(greedy, outputs=[3, 1, 2])) == [1]
    assert sample(logits, banned(greedy, outputs=[4])) == [1]
    # Only the output's own tokens count (vLLM's rule); elsewhere 0 is free.
    assert sample(logits, banned(greedy, outputs=[2])) == [0]
    seqs = seqs_for(greedy, prompt=(1, 2))
    seqs[0].bans = TokenBans.build(greedy, 5, CPU)
    assert sample(logits, seqs) == [0]
    # A batch mixing rows with and without bans, and min_tokens.
    rows = probs_logits(0.4, 0.3, 0.2, 0.06, 0.04, rows=3)
    mixed = banned(
        greedy,
        SamplingParams(temperature=0),
        SamplingParams(temperature=0, min_tokens=5, allowed_token_ids=[0, EOS]),
        outputs=[4],
    )
    assert sample(rows, mixed) == [1, 0, 0]


def test_a_row_where_every_token_is_masked_is_a_dead_end_not_token_0() -> None:
    """A grammar's mask and allowed_token_ids with nothing in common leave no token: the
    sampler says so instead of taking the argmax of nothing (token 0)."""
    logits = probs_logits(0.4, 0.3, 0.2, 0.05, 0.05, rows=2)
    logits[0, 3:] = float("-inf")  # what a grammar allowing only tokens 3 and 4 leaves
    logits[1, 3:] = float("-inf")
    for params in (
        SamplingParams(temperature=0, allowed_token_ids=[3, 4], logprobs=1),
        SamplingParams(temperature=1.0, allowed_token_ids=[3, 4], logprobs=1),
    ):
        seqs = banned(params, SamplingParams(temperature=0))
        st = SamplingTensors.build(seqs, frozenset({EOS}), 5, CPU)
        out = Sampler(0, CPU)(logits.clone(), st, masked=True)
        assert out.token_ids == [DEAD_END, 0]


def test_integer_logit_bias_values_apply() -> None:
    """The library takes `logit_bias={token: -100}` as written, ints included."""
    logits = probs_logits(0.4, 0.3, 0.3)
    params = SamplingParams(temperature=0, logit_bias={0: -100, 1: 1})  # type: ignore[dict-item]
    assert sample(logits, seqs_for(params)) == [1]


def test_penalties_read_from_the_persistent_rows_equal_those_from_the_sequences() -> None:
    """The engine reads the penalized rows' contexts off the input batch's token table (no
    Python pass over each context); the logits must come out as from the sequences' lists,
    whatever the rows' lengths, and for plain rows beside them."""
    from trio_llm.engine.step.input_batch import InputBatch
    from trio_llm.engine.step.sampler import apply_penalties

    rng = np.random.default_rng(0)
    params = [
        SamplingParams(presence_penalty=0.6, frequency_penalty=0.3),
        SamplingParams(),
        SamplingParams(repetition_penalty=1.7, frequency_penalty=0.2),
        SamplingParams(presence_penalty=-0.4, repetition_penalty=0.8),
    ]
    seqs = []
    for i, p in enumerate(params):
        prompt = rng.integers(0, 40, int(rng.integers(1, 30))).tolist()
        seq = Sequence(request_id=str(i), token_ids=prompt, params=p, max_tokens=400)
        seq.token_ids += rng.integers(0, 40, int(rng.integers(0, 300))).tolist()
        seqs.append(seq)
    batch = InputBatch(block_size=16, max_model_len=1024, rows=2)
    rows = batch.sync(seqs)
    logits = torch.randn(len(seqs), 40)
    from_lists, from_rows = logits.clone(), logits.clone()
    apply_penalties(from_lists, SamplingTensors.build(seqs, frozenset({EOS}), 40, CPU))
    columns = batch.sampling(rows)
    assert columns.tokens is not None
    apply_penalties(from_rows, SamplingTensors.build(seqs, frozenset({EOS}), 40, CPU, columns))
    assert torch.equal(from_lists, from_rows)
    assert not torch.equal(from_lists, logits)  # the penalties did something


def test_row_max_is_torchs_max_with_ties_nans_and_infinities() -> None:
    """The greedy token is the first of equal maxima, a NaN's first index where a row has one,
    and an all -inf row's maximum is -inf: numpy's argmax on a CPU must agree with torch.max."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(-3, 4, (12, 1000), generator=gen).float()  # many ties
    logits[1, 17] = float("nan")
    logits[1, 500] = float("nan")
    logits[2] = float("-inf")
    logits[3, [5, 900]] = float("inf")
    logits[4, 999] = 10.0
    logits[5, 0] = 10.0
    for rows in (logits, logits[1:2], logits[::2], logits[:0]):
        top, index = row_max(rows)
        expected_top, expected_index = rows.max(dim=-1)
        assert torch.equal(index, expected_index)
        assert torch.equal(top.isnan(), expected_top.isnan())
        assert torch.equal(top.nan_to_num(), expected_top.nan_to_num())
