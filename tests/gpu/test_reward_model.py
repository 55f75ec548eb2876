"""The classifier reward model (worker.reward.judge.kind=classifier) on CUDA: built as a worker builds it (FSDP2,
nccl), its scores against a plain HF forward of the same texts on the same GPU."""

import pytest
import torch


CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
PROMPTS = ["What is 2 + 3?", "Name a prime number.", "Spell cat.", "Write a long story. " * 20]
RESPONSES = ["5", "7 is prime.", "c-a-t", "Once upon a time " * 10]


def char_tokenizer(path):
    """A character-level tokenizer with a ChatML chat template, built offline (no hub, no packaged tokenizer)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
    vocab = {token: i for i, token in enumerate(specials + [chr(c) for c in range(32, 127)] + ["\n"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    backend.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", eos_token="<|im_end|>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return tokenizer


@pytest.fixture(scope="module")
def small_reward_model_path(tmp_path_factory):
    from transformers import AutoModelForSequenceClassification, Qwen2Config

    from .conftest import SMALL_QWEN2

    path = tmp_path_factory.mktemp("small_rm")
    tokenizer = char_tokenizer(path)
    config = Qwen2Config(**{**SMALL_QWEN2, "vocab_size": len(tokenizer)}, num_labels=1, pad_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    torch.nn.init.normal_(model.score.weight, std=1.0)
    model.save_pretrained(path)
    return str(path)


# raw scores are ~20 wide here (a random head with std 1); bf16 weights and activations through 4 layers move them by
# up to ~3% (0.6 measured on an H100; fp32: 3e-5)
@pytest.mark.parametrize(("dtype", "atol", "rtol"), [("fp32", 1e-4, 0.0), ("bf16", 0.05, 0.05)])
def test_reward_model_scores_equal_a_plain_hf_forward_on_the_gpu(
    process_group, small_reward_model_path, dtype, atol, rtol
):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from easyrl.config.schema import FSDPConfig, ModelConfig
    from easyrl.workers.fsdp_utils import build_device_mesh, build_fsdp_model
    from easyrl.workers.reward_model import RewardModel

    max_length = 200
    fsdp = FSDPConfig(torch_dtype=dtype, mp_param_dtype=dtype)
    model_config = ModelConfig(model_path=small_reward_model_path, enable_gradient_checkpointing=False)
    module = build_fsdp_model(
        model_config, fsdp, build_device_mesh(1, -1), kind="reward", trainable=False, default_dtype=torch.bfloat16
    )
    tokenizer = AutoTokenizer.from_pretrained(small_reward_model_path)
    scores = RewardModel(module, tokenizer, max_length=max_length, micro_batch_size=3).score(PROMPTS, RESPONSES)

    reference = AutoModelForSequenceClassification.from_pretrained(small_reward_model_path, dtype=torch.float32)
    reference = reference.cuda().eval()
    expected = []
    for prompt, response in zip(PROMPTS, RESPONSES):
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        ids = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            expected.append(reference(torch.tensor([ids[:max_length]], device="cuda")).logits[0, 0].item())
    assert scores.device.type == "cpu" and scores.dtype == torch.float32
    print(f"{dtype}: max |easyrl - HF| = {(scores - torch.tensor(expected)).abs().max().item():.3g}, scores {scores}")
    torch.testing.assert_close(scores, torch.tensor(expected), atol=atol, rtol=rtol)
