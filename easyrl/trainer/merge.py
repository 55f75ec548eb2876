"""`easyrl merge`: a checkpoint's sharded actor (or critic) state -> a Hugging Face folder, offline, one process."""

import os


def merge_checkpoint(
    local_dir: str,
    output_dir: str | None = None,
    adapter_only: bool = False,
    base_model: str | None = None,
    dtype: str | None = None,
) -> str:
    """Write `<local_dir>/huggingface` (or `output_dir`): safetensors, config, generation config, tokenizer/processor.

    `local_dir` is a role folder of a checkpoint, e.g. `checkpoints/proj/exp/global_step_40/actor`. A LoRA
    checkpoint gives the full model with the adapters merged in, as EasyR1's merger does (`base_model`: the base
    model's folder or hub id, when it is not the one the adapter config names; written in place, the adapter files
    move to `<local_dir>/lora_adapter`), or with `adapter_only` the peft adapter folder. The weights are written
    in `dtype` (`bf16`/`bfloat16`, `fp16`/`float16`, `fp32`/`float32`), by default the dtype of the model the run
    started from.
    """

    from ..utils.torch_functional import to_dtype
    from ..workers.fsdp_checkpoint import HF_FOLDER, is_role_folder, merge_checkpoint_to_hf

    local_dir = os.path.normpath(local_dir)
    if not os.path.isdir(local_dir):
        raise FileNotFoundError(f"--local_dir `{local_dir}` is not a folder; give a checkpoint's actor folder.")
    if not is_role_folder(local_dir):
        hint = _role_folder_near(local_dir)
        raise FileNotFoundError(
            f"--local_dir `{local_dir}` is not a role folder of a checkpoint (no {HF_FOLDER}/config.json in it). "
            + (f"Did you mean --local_dir {hint}?" if hint else "Give .../global_step_N/actor.")
        )
    output_dir = output_dir or os.path.join(local_dir, HF_FOLDER)
    os.makedirs(output_dir, exist_ok=True)
    torch_dtype = to_dtype(dtype) if dtype else None
    merge_checkpoint_to_hf(local_dir, output_dir, adapter_only=adapter_only, base_model=base_model, dtype=torch_dtype)
    return output_dir


def _role_folder_near(path: str) -> str | None:
    """The role folder meant by a path one level off: a checkpoint (its actor), a run folder (its newest
    checkpoint's actor), or the role's own ``huggingface`` folder (the role)."""
    from ..workers.fsdp_checkpoint import is_role_folder
    from .checkpoint import find_last_checkpoint

    newest = find_last_checkpoint(path)
    for candidate in (os.path.join(path, "actor"), newest and os.path.join(newest, "actor"), os.path.dirname(path)):
        if candidate and is_role_folder(candidate):
            return candidate
    return None


def validate_hub_repo(repo_id: str) -> None:
    """A ValueError naming ``--hf_upload_path`` when ``repo_id`` is not a Hub repo id (``user/name``, or ``name`` in
    the login's own namespace)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ValueError(f"--hf_upload_path `{repo_id}` is not a Hugging Face Hub repo id (user/name): {err}") from err


def upload_to_hub(folder: str, repo_id: str) -> str:
    """Upload ``folder`` to the model repo ``repo_id``, creating it private when it does not exist (EasyR1 creates
    it public: a trained model is published only when its owner means to). Returns the repo's URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    url = api.create_repo(repo_id=repo_id, repo_type="model", private=True, exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type="model")
    return str(url)
