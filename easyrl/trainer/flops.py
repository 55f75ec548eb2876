"""Model FLOPs of a batch and model FLOPs utilisation (MFU).

Training FLOPs of a decoder on sequences of lengths s_i (PaLM, arXiv:2204.02311, appendix B):

    6 * N * sum_i s_i  +  12 * L * (H * d_head) * sum_i s_i^2

N counts the weights used in matrix multiplies per token (attention projections, MLP, lm_head; the embedding
lookup is a gather, not a matmul); the second term is QK^T and attention-times-V (2 matmuls x 2 FLOPs per
multiply-add x 3 for forward + backward), counted over the full s x s square as in PaLM. A forward pass alone
(log-probs, reference, values) costs a third. Recomputation by gradient checkpointing is not counted: this is
MFU, not hardware FLOPs utilisation. Vision towers of VLMs are not counted. For mixture-of-experts models N
counts the experts a token is routed to (plus shared experts and the router). With frozen weights (LoRA trains only
adapters, arXiv 2106.09685) the backward pass computes no weight gradients: 4N instead of 6N per token (the adapters'
own FLOPs, 2 * rank * (in + out) per adapted layer, are negligible and not counted); attention is unchanged.

MFU = model FLOPs / (seconds * devices * peak FLOP/s of one device). GPU peaks come from a table of dense
bf16 tensor-core datasheet numbers; CPU peaks are a rough estimate (threads x clock x FLOPs per cycle of the
widest matrix/vector unit), so CPU MFU is approximate and only good for comparing runs on the same machine.
"""

import os
import re
from collections.abc import Sequence
from typing import Any

import torch

from easyrl.utils import device


class FlopsCounter:
    """FLOPs of forward / forward+backward passes of one causal LM, from its Hugging Face config."""

    def __init__(self, hf_config: Any) -> None:
        config = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
        hidden = config.hidden_size
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        self.num_layers = config.num_hidden_layers
        self.attention_width = heads * head_dim  # H * d_head

        # q and o projections are (hidden x H*d_head); k and v (hidden x H_kv*d_head) with grouped-query attention.
        attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
        experts_per_token = getattr(config, "num_experts_per_tok", None)
        if experts_per_token:
            expert_width = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
            num_experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", 0)
            shared_width = getattr(config, "shared_expert_intermediate_size", 0) or 0
            # gated MLP = 3 matrices (gate, up, down); the router is (hidden x experts)
            mlp = 3 * hidden * (experts_per_token * expert_width + shared_width) + hidden * num_experts
        else:
            mlp = 3 * hidden * config.intermediate_size
        self.matmul_params = self.num_layers * (attention + mlp) + hidden * config.vocab_size  # + lm_head

    def flops(self, seq_lens: Sequence[int], backward: bool = True, frozen_weights: bool = False) -> float:
        """Model FLOPs to process sequences of these lengths (padding excluded); forward only when not backward;
        ``frozen_weights``: the backward pass skips weight gradients (LoRA)."""
        return self._flops(sum(seq_lens), sum(s * s for s in seq_lens), backward, frozen_weights)

    def shared_prefix_flops(
        self, groups: Sequence[tuple[int, Sequence[int]]], backward: bool = True, frozen_weights: bool = False
    ) -> float:
        """Model FLOPs of samples packed with shared prefixes (Prefix Grouper, arXiv 2506.05433): ``groups`` holds
        (prompt length, response lengths) per prompt; the prompt runs once, and a response of length r attends to
        the p prompt tokens and itself, so of each sample's s^2 = p^2 + 2pr + r^2 the p^2 is counted once per group."""
        tokens = sum(prompt + sum(responses) for prompt, responses in groups)
        squares = sum(prompt * prompt + sum(2 * prompt * r + r * r for r in responses) for prompt, responses in groups)
        return self._flops(tokens, squares, backward, frozen_weights)

    def _flops(self, tokens: int, squares: int, backward: bool, frozen_weights: bool) -> float:
        dense = 2 * self.matmul_params * tokens
        attention = 4 * self.num_layers * self.attention_width * squares
        if not backward:
            return float(dense + attention)
        return float(dense * (2 if frozen_weights else 3) + attention * 3)


def compute_mfu(flops: float, seconds: float, n_devices: int, peak_flops_per_device: float) -> float:
    """Share of the devices' peak throughput that the model FLOPs represent."""
    return flops / (seconds * n_devices * peak_flops_per_device)


# ----------------------------------------------------------------------------------------------------------------------
# peak FLOP/s of one device
# ----------------------------------------------------------------------------------------------------------------------
# Dense (no structured sparsity) bf16 tensor-core peak in TFLOP/s, from the vendors' datasheets. V100 and T4 have
# no bf16: their fp16 peak. Keys match whole words of the device name, the longest key winning ("H100 PCIe").
GPU_PEAK_TFLOPS = {
    "B200": 2250.0,
    "GB200": 2500.0,
    "B100": 1750.0,
    "H200": 989.4,
    "GH200": 989.4,
    "H100": 989.4,
    "H100 NVL": 835.0,
    "H100 PCIe": 756.0,
    "H800": 989.4,
    "H800 PCIe": 756.0,
    "H20": 148.0,
    "A100": 312.0,
    "A800": 312.0,
    "A40": 149.7,
    "A10": 125.0,
    "L40S": 362.1,
    "L40": 181.0,
    "L4": 121.0,
    "RTX A6000": 154.8,
    "V100": 125.0,
    "T4": 65.0,
    "MI300X": 1307.4,
    "MI325X": 1307.4,
    "MI250X": 383.0,
}


def gpu_peak_flops(device_name: str) -> float | None:
    """Peak bf16 FLOP/s of a GPU from its name (e.g. "NVIDIA H100 80GB HBM3"), or None when it is not listed."""
    matches = [
        key
        for key in GPU_PEAK_TFLOPS
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", device_name, flags=re.IGNORECASE)
    ]
    return GPU_PEAK_TFLOPS[max(matches, key=len)] * 1e12 if matches else None


def _cpu_flags_and_clock() -> tuple[set[str], float]:
    """CPU feature flags and maximum clock in Hz (Linux; 2.5 GHz when the clock cannot be read)."""
    flags: set[str] = set()
    clock_hz = 0.0
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "flags" and not flags:
                    flags = set(value.split())
                elif key.strip() == "cpu MHz" and not clock_hz:
                    clock_hz = float(value) * 1e6
    except OSError:
        pass
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", encoding="utf-8") as handle:
            clock_hz = float(handle.read()) * 1e3  # kHz
    except (OSError, ValueError):
        pass
    return flags, clock_hz or 2.5e9


def cpu_peak_flops(dtype: torch.dtype = torch.bfloat16, threads: int | None = None) -> float:
    """Rough peak FLOP/s of the CPU threads one worker uses: threads x clock x FLOPs per cycle per core.

    FLOPs per cycle per core: AMX bf16 1024; AVX-512 bf16 dot products 128; AVX-512 fp32 FMA 64 (two units);
    AVX2 FMA 32; otherwise 8. A bf16 run on a CPU without bf16 units computes in fp32 and gets the fp32 rate.
    """
    flags, clock_hz = _cpu_flags_and_clock()
    threads = threads or torch.get_num_threads()
    fp32_per_cycle = 64 if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else 8
    per_cycle = fp32_per_cycle
    if dtype in (torch.bfloat16, torch.float16):
        if "amx_bf16" in flags:
            per_cycle = 1024
        elif "avx512_bf16" in flags:
            per_cycle = 128
    return threads * clock_hz * per_cycle


def peak_flops_per_device(dtype: torch.dtype = torch.bfloat16, override_tflops: float | None = None) -> float | None:
    """Peak FLOP/s of the device this process computes on; None for a GPU missing from the table.

    ``override_tflops`` (e.g. from the config or ``EASYRL_PEAK_TFLOPS``) takes precedence over any lookup.
    """
    override_tflops = override_tflops or float(os.environ.get("EASYRL_PEAK_TFLOPS", 0) or 0)
    if override_tflops:
        return override_tflops * 1e12
    if device.is_cuda_available():
        return gpu_peak_flops(torch.get_device_module(device.get_device_name()).get_device_name())
    return cpu_peak_flops(dtype)
