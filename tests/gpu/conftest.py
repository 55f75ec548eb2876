"""The GPU suite: the worker's compute path on CUDA with nccl, in one plain process (no Ray, no vLLM).

Run with ``pytest -m gpu tests/gpu`` on a machine with an NVIDIA GPU; everywhere else every test here is skipped.
"""

import pytest
import torch


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU (CUDA)"))


# Qwen2-shaped, small enough for seconds per test, big enough that kernels (varlen, Liger, bf16 matmuls) do real work
SMALL_QWEN2 = {
    "vocab_size": 32000,
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
}


@pytest.fixture(scope="session")
def process_group():
    from easyrl.testing.single_rank import one_rank_process_group

    with one_rank_process_group():
        yield


@pytest.fixture(scope="session")
def small_qwen2_path(tmp_path_factory):
    from transformers import AutoModelForCausalLM, Qwen2Config

    path = tmp_path_factory.mktemp("small_qwen2")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(Qwen2Config(**SMALL_QWEN2), dtype=torch.float32).save_pretrained(path)
    return str(path)
