"""`easyrl merge` round trip: a trained checkpoint's sharded actor -> a Hugging Face folder that transformers and vLLM
load, with the trained weights and the trained actor's greedy tokens."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from tests.fixtures.trainer_runs import REPO_ROOT, checkpoint_weights, run_easyrl


PROMPTS = ["What is 12 + 30?", "Tell me a story about a cat.", "Name three colours."]
MAX_NEW_TOKENS = 12
TIMEOUT = 900  # includes the shared training run when this module runs alone

# vLLM in a subprocess: an in-process engine would initialise torch.distributed inside the test process.
VLLM_GREEDY_SCRIPT = """
import json, sys
import easyrl  # process environment fixes, before vLLM is imported
from easyrl.workers.rollout.vllm_rollout import _cpu_engine_environment

path, prompts, max_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
with _cpu_engine_environment():
    from vllm import LLM, SamplingParams

    llm = LLM(model=path, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=64 << 20, max_model_len=256)
outputs = llm.generate(
    [{"prompt_token_ids": ids} for ids in prompts],
    SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False),
    use_tqdm=False,
)
print("GREEDY=" + json.dumps([list(output.outputs[0].token_ids) for output in outputs]))
"""


def _cut_after_eos(tokens: list[int], eos_token_id: int) -> list[int]:
    return tokens[: tokens.index(eos_token_id) + 1] if eos_token_id in tokens else tokens


def hf_greedy(model, prompt_ids: list[list[int]], eos_token_id: int) -> list[list[int]]:
    out = []
    for ids in prompt_ids:
        with torch.no_grad():
            generated = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=MAX_NEW_TOKENS,
                do_sample=False,
                eos_token_id=eos_token_id,
                pad_token_id=eos_token_id,
            )
        out.append(_cut_after_eos(generated[0, len(ids) :].tolist(), eos_token_id))
    return out


@pytest.fixture(scope="module")
def merged(tiny_grpo_run, tmp_path_factory):
    """(actor folder, merged folder): step 3's actor copied out of the shared run, then `easyrl merge --local_dir`."""
    from easyrl.cli import main

    actor_dir = tmp_path_factory.mktemp("merge") / "actor"
    shutil.copytree(tiny_grpo_run.save_dir / "global_step_3" / "actor", actor_dir)
    assert main(["merge", "--local_dir", str(actor_dir)]) == 0
    return actor_dir, actor_dir / "huggingface"


@pytest.fixture(scope="module")
def prompt_ids(merged):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(merged[1])
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in PROMPTS], tokenizer.eos_token_id


@pytest.mark.timeout(TIMEOUT)
def test_merged_folder_holds_exactly_the_checkpoint_weights(merged):
    from transformers import AutoModelForCausalLM

    actor_dir, hf_dir = merged
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    state = model.state_dict()
    trained = checkpoint_weights(actor_dir)
    assert set(trained) <= set(state)
    mismatched = [name for name, tensor in trained.items() if not torch.equal(state[name], tensor)]
    assert not mismatched
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.timeout(TIMEOUT)
def test_merged_model_generates_the_trained_actors_greedy_tokens_in_transformers(merged, prompt_ids, tiny_grpo_run):
    from transformers import AutoConfig, AutoModelForCausalLM

    actor_dir, hf_dir = merged
    ids, eos = prompt_ids
    # the trained actor: the tiny model's own architecture with the checkpoint's weights read straight from DCP
    actor = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_grpo_run.model_path), dtype=torch.float32)
    loaded = actor.load_state_dict(checkpoint_weights(actor_dir), strict=False)
    assert not loaded.unexpected_keys and set(loaded.missing_keys) <= {"lm_head.weight"}  # tied to the embedding
    actor.tie_weights()
    merged_model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    assert hf_greedy(merged_model.eval(), ids, eos) == hf_greedy(actor.eval(), ids, eos)


@pytest.mark.timeout(TIMEOUT)
def test_merged_model_generates_the_same_greedy_tokens_in_vllm(merged, prompt_ids):
    from transformers import AutoModelForCausalLM

    _, hf_dir = merged
    ids, eos = prompt_ids
    expected = hf_greedy(AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval(), ids, eos)
    result = subprocess.run(
        [sys.executable, "-c", VLLM_GREEDY_SCRIPT, str(hf_dir), json.dumps(ids), str(MAX_NEW_TOKENS)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("GREEDY=")]
    assert result.returncode == 0 and lines, f"vLLM failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    vllm_tokens = [_cut_after_eos(tokens, eos) for tokens in json.loads(lines[0][len("GREEDY=") :])]
    assert vllm_tokens == expected


@pytest.mark.timeout(TIMEOUT)
def test_a_folder_one_level_off_is_refused_in_one_line_naming_the_role_folder(tiny_grpo_run, tmp_path, capsys):
    from easyrl.cli import main

    run = tiny_grpo_run.save_dir
    step = run / "global_step_3"
    cases = {
        step: f"Did you mean --local_dir {step / 'actor'}?",  # the checkpoint, not its role
        run: f"Did you mean --local_dir {step / 'actor'}?",  # the run folder: its newest checkpoint
        f"{step / 'actor' / 'huggingface'}/": f"Did you mean --local_dir {step / 'actor'}?",  # the config folder
        tmp_path: "Give .../global_step_N/actor.",
    }
    for local_dir, hint in cases.items():
        assert main(["merge", "--local_dir", str(local_dir)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("easyrl merge: --local_dir") and err.strip().endswith(hint), err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (step / "huggingface").exists() and not (run / "huggingface").exists()


@pytest.mark.timeout(TIMEOUT)
def test_an_upload_that_cannot_reach_the_hub_keeps_the_folder_and_says_how_to_upload_it(merged, tmp_path):
    # EasyR1's merger takes --hf_upload_path; here the Hub is out of reach (offline mode stands for no network)
    import os

    actor_dir, _ = merged
    out = tmp_path / "out"
    args = ["--local_dir", str(actor_dir), "--output_dir", str(out), "--hf_upload_path", "me/tiny-grpo"]
    result = run_easyrl("merge", *args, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"Hugging Face model written to {out}" in result.stdout
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert f"the folder is written ({out}), but uploading it to me/tiny-grpo failed" in result.stderr
    assert "offline mode is enabled" in result.stderr
    assert result.stderr.strip().endswith(f"Upload it later with: hf upload me/tiny-grpo {out}")


@pytest.mark.timeout(TIMEOUT)
def test_an_output_dir_holding_another_model_is_refused_and_a_rerun_of_the_same_merge_is_not(
    merged, tiny_grpo_run, tmp_path, capsys
):
    """--output_dir was written into whatever it held: another model's weights were replaced and its other files (a
    README, an adapter config) left beside the new ones."""
    from easyrl.cli import main

    actor_dir, _ = merged
    other = tmp_path / "other_model"
    other.mkdir()
    (other / "README.md").write_text("my notes\n")
    (other / "model.safetensors").write_bytes(b"weights of another model")
    assert main(["merge", "--local_dir", str(actor_dir), "--output_dir", str(other)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"easyrl merge: --output_dir `{other}` already holds files (README.md, model.safetensors)")
    assert (other / "model.safetensors").read_bytes() == b"weights of another model"
    out = tmp_path / "merged"
    for _ in range(2):  # a new folder, then the same merge again into it
        assert main(["merge", "--local_dir", str(actor_dir), "--output_dir", str(out)]) == 0
    assert (out / "model.safetensors").is_file()
    # another checkpoint into that folder is another model
    step_2 = tiny_grpo_run.save_dir / "global_step_2" / "actor"
    assert main(["merge", "--local_dir", str(step_2), "--output_dir", str(out)]) == 2
    assert f"that no merge of `{step_2}` wrote" in capsys.readouterr().err


def test_a_malformed_hub_repo_is_refused_before_the_merge(tmp_path, capsys):
    from easyrl.cli import main

    out = tmp_path / "out"
    args = ["--local_dir", str(tmp_path), "--output_dir", str(out), "--hf_upload_path", "me/my model"]
    assert main(["merge", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("easyrl merge: --hf_upload_path `me/my model` is not a Hugging Face Hub repo id"), err
    assert not out.exists()


def test_written_weights_are_as_readable_as_the_files_beside_them(tmp_path, tiny_model_path):
    """safetensors 0.8 writes its files 0600: a merged model (and an adapter folder) on a shared filesystem was
    unreadable to everyone else while its config was not."""
    import os

    import torch
    from transformers import AutoModelForCausalLM

    from easyrl.models.checkpoint_layout import save_pretrained_in_released_layout
    from easyrl.models.lora import write_adapter_folder

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    save_pretrained_in_released_layout(model, str(tmp_path / "model"))
    write_adapter_folder(str(tmp_path / "adapter"), {"w": torch.zeros(2)}, {"r": 1})
    for folder, weights in (("model", "model.safetensors"), ("adapter", "adapter_model.safetensors")):
        config = next(name for name in os.listdir(tmp_path / folder) if name.endswith(".json"))
        mode = os.stat(tmp_path / folder / config).st_mode & 0o777
        assert os.stat(tmp_path / folder / weights).st_mode & 0o777 == mode, folder
