"""The vision-language recipes load and validate as `easyrl check` reads them (hub ids need no local folder)."""

from pathlib import Path

import pytest


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
