import re

import msgspec
import pytest

from trio_llm.sampling_params import SamplingParams, SamplingParamsError


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -1.0),
        ("top_p", 0.0),
        ("n", 0),
        ("logprobs", 21),
        ("max_tokens", 0),
        ("presence_penalty", 3.0),
        ("temperature", float("nan")),
    ],
)
def test_out_of_range_names_the_parameter(field: str, value: float) -> None:
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**{field: value}).validate()
    assert info.value.param == field


def test_vocab_check_names_logit_bias() -> None:
    params = SamplingParams(logit_bias={50_000: 1.0, 3: 1.0, 1000: 2.0})
    with pytest.raises(SamplingParamsError) as info:
        params.validate_vocab(1000)
    assert info.value.param == "logit_bias"
    assert str(info.value).endswith(
        "token_id(s) [1000, 50000] in logit_bias contain out-of-vocab token ids. "
        "Vocabulary size: 1000"
    )
    with pytest.raises(
        SamplingParamsError, match=re.escape("101.0 for token 1, -200.0 for token 2")
    ):
        SamplingParams(logit_bias={1: 101.0, 2: -200.0, 3: 5.0}).validate()


def test_round_trips_through_msgpack() -> None:
    params = SamplingParams(temperature=0.5, stop=["x"], logit_bias={3: -2.0}, seed=7)
    data = msgspec.msgpack.encode(params)
    assert msgspec.msgpack.decode(data, type=SamplingParams) == params
