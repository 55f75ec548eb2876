"""The vision-language recipes load and validate as `easyrl check` reads them (hub ids need no local folder)."""

from pathlib import Path

import pytest
import yaml


ROOT = Path(__file__).resolve().parent.parent
VL_RECIPES = sorted(p.name for p in ROOT.glob("examples/*vl*.yaml"))


def test_every_vision_language_family_has_a_recipe():
    assert {"qwen2_5_vl_3b_geo3k_grpo.yaml", "qwen2_5_vl_7b_geo3k_grpo.yaml", "qwen3_vl_4b_geo3k_grpo.yaml"} <= set(
        VL_RECIPES
    )
    assert "shapes_tiny_vl_grpo.yaml" in VL_RECIPES


@pytest.mark.parametrize("recipe", VL_RECIPES)
def test_recipe_passes_easyrl_check_with_images_on(recipe, monkeypatch):
    from easyrl.config import load_config

    monkeypatch.chdir(ROOT)  # recipes name prompt templates and reward files relative to the repository
    config = load_config([f"config=examples/{recipe}"])
    assert config.data.image_key == "images"
    assert config.algorithm.adv_estimator == "grpo"
    assert "vl" in config.worker.actor.model.model_path.lower()


@pytest.mark.parametrize(
    "recipe",
    ["shapes_tiny_vl_grpo_tools.yaml", "qwen2_5_vl_3b_shapes_grpo_tools.yaml", "qwen3_vl_4b_shapes_grpo_tools.yaml"],
)
def test_zoom_tool_recipes_pass_easyrl_check_with_the_tool_and_the_last_turn_reward(recipe, monkeypatch):
    from easyrl.config import load_config

    monkeypatch.chdir(ROOT)
    assert recipe in VL_RECIPES
    config = load_config([f"config=examples/{recipe}"])
    multi_turn = config.worker.rollout.multi_turn
    assert multi_turn.enabled and multi_turn.tools.endswith("tools/image_zoom.py") and multi_turn.parser == "hermes"
    assert config.worker.rollout.limit_images >= 2  # the prompt's picture and at least one zoom
    assert config.worker.reward.reward_function.endswith("reward_function/r1v_tools.py:compute_score")


def test_cold_start_recipes_hand_over_the_model_and_show_it_the_prompt_it_was_taught(monkeypatch):
    from easyrl.config import load_config
    from easyrl.config.sft_plan import load_sft_plan
    from easyrl.data.template import PromptFormatter

    monkeypatch.chdir(ROOT)
    sft = load_sft_plan(["config=examples/shapes_cold_start_sft.yaml"]).config
    recipe = yaml.safe_load((ROOT / "examples/shapes_cold_start_grpo.yaml").read_text())
    handed_over = ROOT / recipe["worker"]["actor"]["model"]["model_path"]
    assert handed_over == Path(sft.trainer.save_checkpoint_path) / "huggingface"
    # (the SFT output does not exist here: the rest of the recipe is checked on the untrained model)
    grpo = load_config(
        ["config=examples/shapes_cold_start_grpo.yaml", "worker.actor.model.model_path=builtin://Small-Qwen2.5-VL"]
    )
    assert sft.data.format_prompt == grpo.data.format_prompt
    assert Path(grpo.data.format_prompt).name == "question_then_image.jinja"
    assert (sft.data.min_pixels, sft.data.max_pixels) == (grpo.data.min_pixels, grpo.data.max_pixels)
    # the question first, then the picture: the picture's tokens can attend to what is asked
    formatter = PromptFormatter(grpo.data.format_prompt)
    assert (
        formatter("<image>How many red circles are in the picture?")
        == "How many red circles are in the picture?<image>"
    )
    # every placeholder moves, in order: a row with two pictures keeps two, a text-only row gains none
    assert formatter("<image>Left or <image>right?") == "Left or right?<image><image>"
    assert formatter("What is 2 + 3?") == "What is 2 + 3?"
