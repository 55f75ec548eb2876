"""LoRA on one process (easyrl.models.lora): which modules get adapters, what is frozen, the adapter's names and
config, and the reference policy as the adapters switched off."""

import json
import subprocess
import sys

import pytest
import torch
from peft import PeftModel, set_peft_model_state_dict
from safetensors.torch import save_file

from easyrl.config.schema import LoraConfig
from easyrl.models import lora
from tests.fixtures.trainer_runs import REPO_ROOT


PROJECTIONS = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


def _text_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


def _vl_model(path):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


def _adapted_modules(model) -> set[str]:
    """Module names (the wrapped model's) that carry an adapter."""
    names = lora.lora_state_dict(model)
    return {name.split(".lora_A.")[0].removeprefix("base_model.model.") for name in names if ".lora_A." in name}


def _randomise_b(model, seed: int = 1) -> None:
    """peft starts B at zero (the adapter is a no-op); a random B makes it matter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)


def test_text_model_gets_adapters_on_every_projection_and_nothing_else(tiny_model_path):
    model = lora.apply_lora(_text_model(tiny_model_path), LoraConfig(rank=4, alpha=8), is_vision_language=False)

    assert lora.has_lora(model)
    expected = {f"model.layers.{i}.{part}.{p}" for i in range(2) for part, ps in
                (("self_attn", ["q_proj", "k_proj", "v_proj", "o_proj"]), ("mlp", ["gate_proj", "up_proj", "down_proj"]))
                for p in ps}  # fmt: skip
    assert _adapted_modules(model) == expected
    assert model.peft_config["default"].target_modules == set(PROJECTIONS)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in model.named_parameters() if ".lora_A." in n or ".lora_B." in n}
    assert len(trainable) == 2 * 14
    assert {p.shape for n, p in model.named_parameters() if "layers.0.self_attn.k_proj.lora_" in n} == {
        torch.Size([4, 64]),  # A: (rank, hidden)
        torch.Size([32, 4]),  # B: (one kv head x head_dim 32, rank)
    }


def test_adapter_output_is_base_plus_scaled_low_rank_product(tiny_model_path):
    """W x + (alpha / r) B A x, with alpha / r = 16 / 4 = 4."""
    model = lora.apply_lora(_text_model(tiny_model_path), LoraConfig(rank=4, alpha=16), is_vision_language=False)
    _randomise_b(model)
    q_proj = model.base_model.model.model.layers[0].self_attn.q_proj
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    a, b = q_proj.lora_A["default"].weight, q_proj.lora_B["default"].weight
    expected = x @ q_proj.base_layer.weight.T + q_proj.base_layer.bias + 4.0 * (x @ a.T @ b.T)
    torch.testing.assert_close(q_proj(x), expected, rtol=1e-5, atol=1e-6)


def test_adapters_off_is_the_base_model(tiny_model_path):
    base = _text_model(tiny_model_path)
    model = lora.apply_lora(_text_model(tiny_model_path), LoraConfig(rank=4, alpha=8), is_vision_language=False)
    _randomise_b(model)
    ids = torch.tensor([[5, 17, 300, 42, 9]])
    with torch.no_grad():
        base_logits = base(ids).logits
        adapted = model(input_ids=ids).logits
        with lora.adapter_disabled(model):
            reference = model(input_ids=ids).logits
    torch.testing.assert_close(reference, base_logits, rtol=0, atol=0)
    assert (adapted - base_logits).abs().max() > 1e-3


def test_state_dict_and_config_load_back_as_a_peft_adapter(tiny_model_path, tmp_path):
    model = lora.apply_lora(_text_model(tiny_model_path), LoraConfig(rank=4, alpha=8), is_vision_language=False)
    _randomise_b(model)
    state = lora.lora_state_dict(model)
    assert len(state) == 28
    assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in state
    assert all(".default." not in name for name in state)

    # into a fresh wrapper with set_peft_model_state_dict
    other = lora.apply_lora(_text_model(tiny_model_path), LoraConfig(rank=4, alpha=8), is_vision_language=False)
    result = set_peft_model_state_dict(other, state)
    assert not result.unexpected_keys
    ids = torch.tensor([[5, 17, 300, 42, 9]])
    with torch.no_grad():
        torch.testing.assert_close(other(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)

    # as a folder, through PeftModel.from_pretrained
    config = lora.lora_peft_config(model)
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8, "LORA")
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "adapter_model.safetensors")
    loaded = PeftModel.from_pretrained(_text_model(tiny_model_path), tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)


def test_target_modules_subset_and_exclusion_regex(tiny_model_path):
    config = LoraConfig(rank=2, alpha=2, target_modules="q_proj, v_proj", exclude_modules=r".*layers\.1\..*")
    model = lora.apply_lora(_text_model(tiny_model_path), config, is_vision_language=False)
    assert _adapted_modules(model) == {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"}


def test_target_module_naming_nothing_is_refused_with_the_names_there_are(tiny_model_path):
    with pytest.raises(ValueError) as error:
        lora.apply_lora(
            _text_model(tiny_model_path), LoraConfig(rank=4, target_modules=["qkv"]), is_vision_language=False
        )
    message = str(error.value)
    assert "`worker.actor.model.lora.target_modules` names `qkv`" in message
    assert "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj" in message
    with pytest.raises(ValueError, match="names `lm_head`"):  # the head never gets an adapter
        lora.apply_lora(
            _text_model(tiny_model_path), LoraConfig(rank=4, target_modules="lm_head"), is_vision_language=False
        )


def test_adapter_init_is_the_same_on_every_call(tiny_model_path):
    """Every FSDP rank wraps its own copy: the A matrices must agree without a broadcast."""
    torch.manual_seed(1)
    first = lora.lora_state_dict(
        lora.apply_lora(_text_model(tiny_model_path), LoraConfig(rank=4), is_vision_language=False)
    )
    torch.manual_seed(2)
    second = lora.lora_state_dict(
        lora.apply_lora(_text_model(tiny_model_path), LoraConfig(rank=4), is_vision_language=False)
    )
    assert all(torch.equal(first[name], second[name]) for name in first)


def test_vl_model_vision_tower_frozen_and_adapter_free_by_default(tiny_vl_model_path):
    model = lora.apply_lora(_vl_model(tiny_vl_model_path), LoraConfig(rank=4, alpha=8), is_vision_language=True)
    adapted = _adapted_modules(model)
    assert len(adapted) == 14
    assert all(name.startswith("model.language_model.layers.") for name in adapted)
    tower = model.get_base_model().model.visual
    assert not any(p.requires_grad for p in tower.parameters())
    assert not any("lora_" in name for name, _ in tower.named_parameters())


def test_vl_model_vision_tower_adapters_when_asked(tiny_vl_model_path):
    config = LoraConfig(rank=4, alpha=8, vision_tower=True)
    model = lora.apply_lora(_vl_model(tiny_vl_model_path), config, is_vision_language=True)
    adapted = _adapted_modules(model)
    tower = {name for name in adapted if name.startswith("model.visual.")}
    # two blocks x (qkv, proj, gate/up/down) + the merger's two linear layers
    assert tower == {
        *(f"model.visual.blocks.{i}.{p}" for i in range(2) for p in
          ("attn.qkv", "attn.proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")),
        "model.visual.merger.mlp.0",
        "model.visual.merger.mlp.2",
    }  # fmt: skip
    assert len(adapted - tower) == 14
    assert "model.visual.patch_embed.proj" not in adapted  # a convolution, whatever its name


@pytest.mark.parametrize(
    ("recipe", "rank", "alpha", "lr", "ref_from_actor"),
    [
        ("smollm2_arithmetic_grpo_lora", 8, 16, 2e-4, False),  # KL off: no reference at all
        ("qwen3_4b_math_grpo_lora", 64, 64, 1e-5, True),
        ("qwen3_vl_4b_geo3k_grpo_lora", 64, 64, 1e-5, True),
    ],
)
def test_lora_recipes_pass_check_with_the_reference_served_by_the_actor(
    recipe, rank, alpha, lr, ref_from_actor, monkeypatch
):
    from pathlib import Path

    from easyrl.config.plan import load_run_plan

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    plan = load_run_plan([f"config=examples/{recipe}.yaml"])
    lora_config = plan.config.worker.actor.model.lora
    assert (lora_config.rank, lora_config.alpha, lora_config.target_modules) == (rank, alpha, "all-linear")
    assert plan.config.worker.actor.optim.lr == lr
    assert plan.ref_from_actor is ref_from_actor
    assert plan.worker_role == "actor_rollout"  # never a separate reference model


def test_check_refuses_lora_on_the_critic_and_a_bad_dropout():
    from easyrl.config import ConfigError
    from easyrl.config.plan import load_run_plan

    base = [
        "worker.actor.model.model_path=builtin://SmolLM2-135M-Instruct",
        "worker.reward.reward_function=reward_function/arithmetic.py:compute_score",
        "data.train_files=builtin://arithmetic_small@train",
        "worker.rollout.n=4",
        "worker.actor.model.lora.rank=8",
    ]
    assert load_run_plan(base).config.worker.actor.model.lora.rank == 8
    with pytest.raises(ConfigError, match=r"`worker\.critic\.model\.lora\.rank` is 8: LoRA trains the actor only"):
        load_run_plan(base + ["algorithm.adv_estimator=gae", "worker.critic.model.lora.rank=8"])
    with pytest.raises(ConfigError, match=r"worker\.actor\.model\.lora\.dropout"):
        load_run_plan(base + ["worker.actor.model.lora.dropout=1.0"])
    with pytest.raises(ConfigError, match=r"`worker\.actor\.model\.lora\.exclude_modules` is not a valid regex"):
        load_run_plan(base + ["worker.actor.model.lora.exclude_modules=.*visual(.*"])
    # adapters on a vision encoder asked to stay frozen: the two keys contradict each other (the adapters trained)
    tower = ["worker.actor.model.lora.vision_tower=true", "worker.actor.model.freeze_vision_tower=true"]
    with pytest.raises(ConfigError, match=r"lora\.vision_tower=true` trains adapters on the vision encoder that "):
        load_run_plan(base + tower)
    assert load_run_plan(base + tower[:1]).config.worker.actor.model.lora.vision_tower
    assert load_run_plan(base + tower[1:]).config.worker.actor.model.freeze_vision_tower
    # EasyR1's `.*visual.*` kept while vision_tower is turned on: no vision adapter would train (before: silently)
    for exclude in (".*visual.*", r"model\.visual.*"):
        with pytest.raises(ConfigError, match=r"`worker\.actor\.model\.lora\.exclude_modules` \(.*\) excludes it"):
            load_run_plan(base + tower[:1] + [f"worker.actor.model.lora.exclude_modules={exclude}"])
    exclude_lm_layer = [r"worker.actor.model.lora.exclude_modules=.*layers\.1\..*"]
    assert load_run_plan(base + tower[:1] + exclude_lm_layer).config.worker.actor.model.lora.vision_tower


@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_merging_into_a_bf16_base_held_in_bf16_rounds_the_fp32_sum_once(tiny_model_path, tmp_path, out_dtype):
    # the base stays in bf16 (half the memory of an fp32 copy); the result must equal the fp32 merge, rounded
    from transformers import AutoModelForCausalLM

    from easyrl.workers.fsdp_checkpoint import merge_adapter_folder

    base_path = tmp_path / "bf16-base"
    _text_model(tiny_model_path).to(torch.bfloat16).save_pretrained(base_path)
    model = lora.apply_lora(_text_model(base_path), LoraConfig(rank=4, alpha=8), is_vision_language=False)
    _randomise_b(model)
    lora.write_adapter_folder(str(tmp_path / "adapter"), lora.lora_state_dict(model), lora.lora_peft_config(model))

    adapter, merged_path = str(tmp_path / "adapter"), str(tmp_path / "merged")
    merge_adapter_folder(adapter, str(base_path), merged_path, config_path=str(base_path), dtype=out_dtype)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype="auto").state_dict()
    fp32_merge = PeftModel.from_pretrained(_text_model(base_path), tmp_path / "adapter").merge_and_unload()
    expected = fp32_merge.to(out_dtype or torch.bfloat16).state_dict()
    assert merged.keys() == expected.keys()
    for name, tensor in expected.items():
        assert merged[name].dtype == (out_dtype or torch.bfloat16) and torch.equal(merged[name], tensor), name
    changed = [name for name in expected if name.endswith("q_proj.weight")]
    base = _text_model(base_path).state_dict()
    assert changed and all(not torch.equal(merged[name].float(), base[name]) for name in changed)


@pytest.mark.parametrize("vision_tower", [False, True])
def test_a_vision_language_adapter_merges_into_a_model_that_loads_in_the_released_layout(
    tiny_vl_model_path, tmp_path, vision_tower
):
    # the merge `easyrl merge` now writes by default for a LoRA checkpoint, on a Qwen2.5-VL: the merged folder loads
    # as a plain model (released key names, no adapter keys) and gives the adapted model's logits, picture included
    import safetensors.torch
    from PIL import Image
    from transformers import AutoProcessor

    from easyrl.workers.fsdp_checkpoint import merge_adapter_folder

    config = LoraConfig(rank=4, alpha=8, vision_tower=vision_tower)
    model = lora.apply_lora(_vl_model(tiny_vl_model_path), config, is_vision_language=True)
    _randomise_b(model)
    adapter = tmp_path / "adapter"
    lora.write_adapter_folder(str(adapter), lora.lora_state_dict(model), lora.lora_peft_config(model))
    merge_adapter_folder(
        str(adapter), str(tiny_vl_model_path), str(tmp_path / "merged"), config_path=str(tiny_vl_model_path)
    )

    written = safetensors.torch.load_file(tmp_path / "merged" / "model.safetensors")
    released = safetensors.torch.load_file(next(tiny_vl_model_path.glob("*.safetensors")))
    assert written.keys() == released.keys()  # the layout the base was released in, which vLLM reads
    merged = _vl_model(tmp_path / "merged")
    processor = AutoProcessor.from_pretrained(tiny_vl_model_path)
    picture = Image.new("RGB", (56, 56), (200, 30, 30))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(text=[text], images=[picture], return_tensors="pt")
    with torch.no_grad():
        expected = model(**inputs).logits
        torch.testing.assert_close(merged(**inputs).logits, expected, atol=1e-5, rtol=0)
        with model.disable_adapter():
            assert (model(**inputs).logits - expected).abs().max() > 1e-4  # the adapters matter
    changed_tower = any(
        not torch.equal(written[name], released[name]) for name in released if "visual" in name and "weight" in name
    )
    assert changed_tower == vision_tower


# A reference pass before the first update (KL on, on-policy) under bf16 compute with fp32 gradient reduction, the
# default on a GPU, in a plain one-rank process group: the first backward failed there ("attempting to assign a
# gradient with dtype BFloat16 to a tensor with grad_dtype Float").
REFERENCE_FIRST = """
import sys, torch
from easyrl.models import lora
from easyrl.testing.single_rank import build_actor, one_rank_process_group
from tests.fsdp_helpers import make_batch

overrides = [
    "worker.actor.fsdp.torch_dtype=fp32", "worker.actor.fsdp.mp_param_dtype=bf16", "worker.actor.fsdp.mp_reduce_dtype=fp32",
    "worker.actor.use_torch_compile=false", "worker.actor.micro_batch_size_per_device_for_update=3",
    "worker.actor.micro_batch_size_per_device_for_experience=3", "worker.actor.model.lora.rank=4",
]
with one_rank_process_group():
    actor, module, _ = build_actor(sys.argv[1], overrides, batch_size=6)
    data = make_batch(batch_size=6, vocab=1000, seed=3)
    with lora.adapter_disabled(module):
        reference, _ = actor.compute_log_probs(data)
    data.batch["old_log_probs"], data.batch["advantages"] = reference, torch.randn(reference.shape)
    data.batch["ref_log_probs"] = reference
    before = {n: p.detach().full_tensor().clone() for n, p in module.named_parameters() if p.requires_grad}
    metrics = actor.update_policy(data)
    moved = [n for n, p in module.named_parameters() if p.requires_grad and not torch.equal(before[n], p.detach().full_tensor())]
    print("MOVED", len(moved), len(before), metrics["actor/nonfinite_grad_skipped_steps"])
"""


def test_a_reference_pass_before_the_first_update_keeps_bf16_lora_training(tiny_model_path):
    done = subprocess.run(
        [sys.executable, "-c", REFERENCE_FIRST, str(tiny_model_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    moved, trainable, skipped = done.stdout.split("MOVED ")[1].split()
    assert int(moved) > 0 and int(trainable) == 28 and skipped in ("0", "0.0")


@pytest.mark.parametrize(
    ("keys", "said"),
    [
        (["target_modules=[q_proj,qkv]"], "names `qkv`, which matches no linear layer"),
        (["target_modules=all_linear"], "all_linear"),
        (["target_modules=q_proj", r"exclude_modules=.*layers\..*"], "exclude_modules"),
    ],
    ids=["a_vision_name", "a_typo_of_all_linear", "everything_excluded"],
)
def test_target_modules_that_adapt_nothing_stop_before_ray(tiny_model_path, keys, said):
    """Before: `easyrl check` called such a config valid, and the run stopped only once Ray and the engine had
    started (the workers' refusal, about a minute in on this machine)."""
    from easyrl.config.plan import load_run_plan
    from easyrl.trainer.preflight import check_model_files

    base = [
        f"worker.actor.model.model_path={tiny_model_path}",
        "worker.reward.reward_function=reward_function/arithmetic.py:compute_score",
        "data.train_files=builtin://arithmetic_small@train",
        "worker.rollout.n=4",
        "worker.actor.model.lora.rank=4",
    ]
    with pytest.raises(ValueError) as refused:
        check_model_files(load_run_plan(base + [f"worker.actor.model.lora.{key}" for key in keys]))
    assert said in str(refused.value) and "`worker.actor.model.lora." in str(refused.value)
    check_model_files(load_run_plan(base))  # all-linear adapts every projection: nothing to refuse
