"""A sequence-classification reward model (`worker.reward.judge.kind=classifier`) inside the FSDP worker.

The model (AutoModelForSequenceClassification with one label, e.g. a Skywork-Reward checkpoint) is a frozen FSDP2
module beside the reference policy, on the same devices, with no optimizer. It reads TEXT, not the policy's token
ids: its tokenizer and chat template may differ from the policy's. Each sample becomes the conversation
[user: prompt, assistant: response] in the reward model's chat template, tokenized with its own tokenizer, cut at
`max_length` tokens (the end goes, the prompt stays), and its raw score is the model's scalar output at the last
token of that text. The driver maps raw scores to judge scores (`reward_model_score`, torch-free).
"""

import logging

import torch

from ..data.tokenizer import CHAT_TEMPLATE_PLACES, has_chat_template
from ..utils import device


logger = logging.getLogger(__name__)


class RewardModel:
    """Scores (prompt, response) texts with a sharded sequence-classification module; every rank calls `score`
    together (FSDP2 gathers each layer's weights across the ranks)."""

    def __init__(self, module: torch.nn.Module, tokenizer, max_length: int, micro_batch_size: int) -> None:
        head = getattr(module, "score", None)
        if not isinstance(head, torch.nn.Module):
            raise ValueError(
                f"worker.reward.judge.model_path loads a {type(module).__name__}, which has no `score` head; a "
                "classifier reward model must be a decoder LM's *ForSequenceClassification (Qwen2, Llama, ...)."
            )
        if not has_chat_template(tokenizer):
            raise ValueError(
                "The reward model's tokenizer (worker.reward.judge.model_path) has no chat template: easyrl writes "
                "each sample as [user: prompt, assistant: response] in the reward model's own template; its folder "
                f"needs {CHAT_TEMPLATE_PLACES}."
            )
        self.module = module
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.micro_batch_size = max(1, micro_batch_size)
        # HF pools the head's output at the last token that is not `pad_token_id`, so a text that ends with the pad
        # token (often eos = <|im_end|>) would be scored one token early; the per-token head output is taken here and
        # read at each text's own last token instead
        self._head_output: torch.Tensor | None = None
        head.register_forward_hook(self._keep_head_output)
        if module.config.pad_token_id is None:  # HF's pooling refuses batches > 1 without one; its choice is unused
            module.config.pad_token_id = 0
        self._warned_cut = False

    def _keep_head_output(self, _module, _inputs, output: torch.Tensor) -> None:
        self._head_output = output

    def encode(self, prompt: "str | list[dict]", response: str) -> list[int]:
        """One sample's token ids: the reward model's chat template over the prompt's messages (or [user: prompt])
        and [assistant: response]."""
        turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        messages = [*turns, {"role": "assistant", "content": response}]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False)
        # the template writes the special tokens (bos among them) itself
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def score(self, prompts: list, responses: list[str]) -> torch.Tensor:
        """Raw scores (batch,) fp32 on the CPU: the head's output at each text's last token."""
        rows = [self.encode(prompt, response) for prompt, response in zip(prompts, responses, strict=True)]
        cut = sum(len(row) > self.max_length for row in rows)
        if cut and not self._warned_cut:
            self._warned_cut = True
            logger.warning(
                "%d of %d reward-model inputs are longer than worker.reward.judge.max_length=%d tokens and were cut "
                "at the end (scored as cut); raise max_length if the reward model takes longer inputs (logged once).",
                cut,
                len(rows),
                self.max_length,
            )
        rows = [row[: self.max_length] for row in rows]
        scores = []
        torch_device = device.get_torch_device()
        for start in range(0, len(rows), self.micro_batch_size):
            micro = rows[start : start + self.micro_batch_size]
            width = max(len(row) for row in micro)
            input_ids = torch.zeros(len(micro), width, dtype=torch.long)  # right-padded; pads never reach the score
            attention_mask = torch.zeros(len(micro), width, dtype=torch.long)
            for i, row in enumerate(micro):
                input_ids[i, : len(row)] = torch.tensor(row)
                attention_mask[i, : len(row)] = 1
            self.module(input_ids=input_ids.to(torch_device), attention_mask=attention_mask.to(torch_device))
            per_token = self._head_output[..., 0].float()  # (micro, width)
            last = (attention_mask.sum(-1) - 1).to(per_token.device)
            rows_index = torch.arange(len(micro), device=per_token.device)
            scores.append(per_token[rows_index, last].cpu())
            self._head_output = None
        return torch.cat(scores) if scores else torch.zeros(0)
