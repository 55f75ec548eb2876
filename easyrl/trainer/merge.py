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
    own = os.path.join(local_dir, HF_FOLDER)
    output_dir = os.path.normpath(output_dir) if output_dir else own
    if output_dir != own:
        _check_output_dir_is_ours(output_dir, local_dir)
    os.makedirs(output_dir, exist_ok=True)
    torch_dtype = to_dtype(dtype) if dtype else None
    merge_checkpoint_to_hf(local_dir, output_dir, adapter_only=adapter_only, base_model=base_model, dtype=torch_dtype)
    if output_dir != own:
        with open(os.path.join(output_dir, MERGED_FROM), "w") as handle:
            handle.write(os.path.abspath(local_dir) + "\n")
    return output_dir


# written into an --output_dir of a merge: the checkpoint it holds, so that a rerun may write over it
MERGED_FROM = ".easyrl_merged_from"


def _check_output_dir_is_ours(output_dir: str, local_dir: str) -> None:
    """An --output_dir holding anything but an earlier merge of the same checkpoint is refused: another model's weights
    would be replaced, and its other files (an adapter config, a README) left beside the new weights."""
    if not os.path.isdir(output_dir):
        if os.path.exists(output_dir):
            raise FileExistsError(f"--output_dir `{output_dir}` is a file; give a new or empty folder.")
        return
    entries = sorted(os.listdir(output_dir))
    if not entries:
        return
    marker = os.path.join(output_dir, MERGED_FROM)
    if os.path.isfile(marker):
        with open(marker) as handle:
            if handle.read().strip() == os.path.abspath(local_dir):
                return
    shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
    raise FileExistsError(
        f"--output_dir `{output_dir}` already holds files ({shown}) that no merge of `{local_dir}` wrote: the merge "
        "would replace its weights and leave the rest beside them. Give a new or empty folder, or delete this one."
    )


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
