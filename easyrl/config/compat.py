"""EasyR1 compatibility: other spellings of keys and choices that load unchanged, and the keys whose meaning in
easyrl differs from EasyR1's (a warning names each one a config relies on; docs/config.md gives the reasons)."""

import logging
from typing import Any


# EasyR1 spells some choices and keys differently across versions; both spellings load.
LOSS_AVG_MODE_ALIASES = {"token": "token-mean", "seq": "seq-mean-token-mean"}
LOSS_TYPE_ALIASES = {"default": "ppo", "vanilla": "ppo"}
# Values another framework gives a choice that easyrl names otherwise: key -> {value: what to write instead}. TRL's
# loss_type is the loss's aggregation, which easyrl calls loss_avg_mode (its loss_type is the policy loss).
FOREIGN_CHOICE_VALUES = {
    "worker.actor.loss_type": {
        "grpo": "TRL's loss_type=grpo is the aggregation worker.actor.loss_avg_mode=seq-mean-token-mean",
        "bnpo": "TRL's loss_type=bnpo is the aggregation worker.actor.loss_avg_mode=token-mean",
        "dapo": "TRL's loss_type=dapo is the aggregation worker.actor.loss_avg_mode=token-mean",
        "dr_grpo": "TRL's loss_type=dr_grpo is worker.actor.loss_avg_mode=seq-mean-token-sum-norm with "
        "algorithm.norm_adv_by_std_in_grpo=false (Dr. GRPO; TRL's max_completion_length is data.max_response_length)",
    },
}
LEGACY_KEYS = {
    "worker.actor.ulysses_sequence_parallel_size": "worker.actor.ulysses_size",
    "worker.critic.ulysses_sequence_parallel_size": "worker.critic.ulysses_size",
    "worker.ref.ulysses_sequence_parallel_size": "worker.ref.ulysses_size",
    "worker.reward.score_function": "worker.reward.reward_function",
    "worker.reward.score_function_kwargs": "worker.reward.reward_function_kwargs",
    "trainer.total_episodes": "trainer.total_epochs",
}
# Keys older EasyR1 configs carry that no longer mean anything: accepted, ignored, and said so (-> what to write).
IGNORED_LEGACY_KEYS = {
    "worker.reward.compute_score": "name the reward file and function with worker.reward.reward_function (EasyR1's "
    "`compute_score: math` is `reward_function/math.py:compute_score`, `r1v` is `reward_function/r1v.py:compute_score`)"
}


def rename_legacy(flat: dict[str, Any]) -> dict[str, Any]:
    """Flat {dotted key: value} with legacy keys renamed and ignored ones dropped (with a warning naming the fix)."""
    for key in flat.keys() & IGNORED_LEGACY_KEYS.keys():
        logging.getLogger(__name__).warning(
            "%s=%s is an older EasyR1 key that easyrl ignores: %s.", key, flat[key], IGNORED_LEGACY_KEYS[key]
        )
    return {LEGACY_KEYS.get(key, key): value for key, value in flat.items() if key not in IGNORED_LEGACY_KEYS}


# How easyrl sets what verl's *_max_token_len_per_gpu set (easyrl.models.dynamic_batching): no key of its own.
TOKEN_BUDGET_NOTE = (
    "easyrl has no token-budget key; with dynamic_batching (the default) a micro-batch holds up to {size} x "
    "(data.max_prompt_length + data.max_response_length) tokens, so set {size} to the budget divided by that length"
)
# What verl and TRL (and EasyR1's verl roots) call a setting that easyrl names otherwise: the name (a key's last part,
# or its last parts) -> the easyrl key (or its last parts, when several sections have it: the one in the section the
# given key names is suggested) and what the name means. These are suggestions for the "Unknown config key" error
# only, never renames: a config written for another framework is refused key by key, each time naming the easyrl key
# to write (its units and defaults are the user's to check), while LEGACY_KEYS above load EasyR1's own spellings.
FOREIGN_KEY_NAMES: dict[str, tuple[str, str]] = {
    # verl
    "train_batch_size": ("data.rollout_batch_size", "verl's data.train_batch_size: prompts per training step"),
    "total_training_steps": ("trainer.max_steps", "verl's trainer.total_training_steps: training steps in all"),
    "ppo_mini_batch_size": (
        "global_batch_size",
        "verl's ppo_mini_batch_size: prompts per optimizer step, each sampled rollout.n times",
    ),
    "ppo_micro_batch_size_per_gpu": (
        "micro_batch_size_per_device_for_update",
        "verl's ppo_micro_batch_size_per_gpu: samples per forward/backward pass on one device",
    ),
    "log_prob_micro_batch_size_per_gpu": (
        "micro_batch_size_per_device_for_experience",
        "verl's log_prob_micro_batch_size_per_gpu: samples per log-prob forward pass on one device",
    ),
    "forward_micro_batch_size_per_gpu": (
        "micro_batch_size_per_device_for_experience",
        "verl's critic forward_micro_batch_size_per_gpu: samples per value forward pass on one device",
    ),
    "tensor_model_parallel_size": ("worker.rollout.tensor_parallel_size", "verl's rollout tensor_model_parallel_size"),
    "ulysses_sequence_parallel_size": ("ulysses_size", "verl's ulysses_sequence_parallel_size"),
    "kl_loss_coef": (
        "algorithm.kl_coef",
        "verl's kl_loss_coef; the KL is a loss term with algorithm.use_kl_loss=true",
    ),
    "kl_loss_type": ("algorithm.kl_penalty", "verl's kl_loss_type: the KL estimator (kl, abs, mse, low_var_kl)"),
    "use_kl_in_reward": (
        "algorithm.use_kl_loss",
        "verl's use_kl_in_reward: the KL to the reference is a reward penalty when algorithm.disable_kl=false and "
        "algorithm.use_kl_loss=false (easyrl's defaults), a loss term with use_kl_loss=true, off with disable_kl=true",
    ),
    "clip_ratio": (
        "clip_ratio_low",
        "verl's clip_ratio sets both bounds: give clip_ratio_low and clip_ratio_high, the ratio is clipped to "
        "[1 - clip_ratio_low, 1 + clip_ratio_high]",
    ),
    "clip_ratio_c": ("clip_ratio_dual", "verl's clip_ratio_c: the dual-clip constant C"),
    "tis_imp_ratio_cap": (
        "worker.actor.tis_cap",
        "verl's tis_imp_ratio_cap: the cap of the truncated importance weight against the rollout's log-probs",
    ),
    "rollout_is_threshold": (
        "worker.actor.tis_cap",
        "verl's rollout_is_threshold: the upper cap of the token-level importance weight against the rollout's "
        "log-probs (easyrl truncates the weight there)",
    ),
    "use_dynamic_bsz": ("dynamic_batching", "verl's use_dynamic_bsz: micro-batches by a token budget"),
    "log_prob_use_dynamic_bsz": (
        "worker.actor.dynamic_batching",
        "verl's log_prob_use_dynamic_bsz; the log-prob and reference passes follow worker.actor.dynamic_batching",
    ),
    "ppo_max_token_len_per_gpu": (
        "micro_batch_size_per_device_for_update",
        f"verl's ppo_max_token_len_per_gpu: {TOKEN_BUDGET_NOTE.format(size='micro_batch_size_per_device_for_update')}",
    ),
    "log_prob_max_token_len_per_gpu": (
        "micro_batch_size_per_device_for_experience",
        "verl's log_prob_max_token_len_per_gpu: "
        + TOKEN_BUDGET_NOTE.format(size="micro_batch_size_per_device_for_experience"),
    ),
    "forward_max_token_len_per_gpu": (
        "micro_batch_size_per_device_for_experience",
        "verl's critic forward_max_token_len_per_gpu: "
        + TOKEN_BUDGET_NOTE.format(size="micro_batch_size_per_device_for_experience"),
    ),
    "max_token_len_per_gpu": (
        "micro_batch_size_per_device_for_update",
        f"verl's *_max_token_len_per_gpu: {TOKEN_BUDGET_NOTE.format(size='micro_batch_size_per_device_for_update')}",
    ),
    "drop_last": (
        "data.rollout_batch_size",
        "training drops the last partial batch of each epoch (with data.shuffle=true its rows are drawn in other "
        "epochs), as EasyR1 does; validation and `easyrl eval` use every row",
    ),
    "dataloader_drop_last": (
        "data.rollout_batch_size",
        "TRL's dataloader_drop_last: training drops the last partial batch of each epoch, validation uses every row",
    ),
    "val_max_samples": (
        "data.val_files",
        "verl's val_max_samples: the first N rows of a data file are `data.val_files=FILE@train[:N]`",
    ),
    "train_max_samples": (
        "data.train_files",
        "verl's train_max_samples: the first N rows of a data file are `data.train_files=FILE@train[:N]`",
    ),
    "lr_warmup_steps_ratio": ("optim.lr_warmup_ratio", "verl's lr_warmup_steps_ratio"),
    "grad_clip": ("max_grad_norm", "verl's grad_clip: gradient-norm clipping"),
    "param_offload": ("offload.offload_params", "verl's fsdp_config.param_offload"),
    "optimizer_offload": ("offload.offload_optimizer", "verl's fsdp_config.optimizer_offload"),
    "model.path": ("model_path", "verl's model.path"),
    "test_freq": ("trainer.val_freq", "verl's trainer.test_freq: steps between validations"),
    "default_local_dir": ("trainer.save_checkpoint_path", "verl's trainer.default_local_dir: the checkpoint folder"),
    "resume_from_path": ("trainer.load_checkpoint_path", "verl's trainer.resume_from_path"),
    "multi_turn.tool_config_path": (
        "worker.rollout.multi_turn.tools",
        "verl's tool YAML; easyrl reads a .py file whose TOOLS list names typed, documented functions",
    ),
    "multi_turn.enable": (
        "worker.rollout.multi_turn.tools",
        "verl's multi_turn.enable; multi-turn is on when multi_turn.tools or multi_turn.env names a file",
    ),
    "val_kwargs": (
        "worker.rollout.val_override_config",
        "verl's rollout.val_kwargs: sampling settings of validation, over the training ones",
    ),
    "policy_loss.loss_mode": (
        "worker.actor.loss_type",
        "verl's policy_loss.loss_mode: the policy loss (verl's vanilla is easyrl's default; gspo, cispo, ...)",
    ),
    "warmup_style": ("optim.lr_scheduler_type", "verl's optim.warmup_style: the schedule after warmup"),
    "custom_reward_function.path": (
        "worker.reward.reward_function",
        "verl's custom_reward_function.path: easyrl takes the file and the function in one key, `path.py:function`",
    ),
    "custom_reward_function.name": (
        "worker.reward.reward_function",
        "verl's custom_reward_function.name: easyrl takes the file and the function in one key, `path.py:function`",
    ),
    "max_actor_ckpt_to_keep": ("trainer.save_limit", "verl's max_actor_ckpt_to_keep: checkpoints kept"),
    "max_ckpt_to_keep": ("trainer.save_limit", "verl's checkpoint.max_ckpt_to_keep: checkpoints kept"),
    "use_remove_padding": ("padding_free", "verl's use_remove_padding: sequences packed without padding"),
    "lora_rank": ("model.lora.rank", "verl's lora_rank"),
    "lora_alpha": ("model.lora.alpha", "verl's lora_alpha"),
    "resume_mode": (
        "trainer.find_last_checkpoint",
        "verl's resume_mode: auto is easyrl's default (find_last_checkpoint=true), disable is false, and "
        "resume_path is trainer.load_checkpoint_path",
    ),
    "truncation": (
        "data.filter_overlong_prompts",
        "verl's data.truncation: easyrl drops prompts over data.max_prompt_length (true) or cuts them (false), and "
        "counts them either way",
    ),
    # TRL
    "learning_rate": ("optim.lr", "TRL's learning_rate"),
    "per_device_train_batch_size": (
        "micro_batch_size_per_device_for_update",
        "TRL's per_device_train_batch_size: samples per forward/backward pass on one device; an optimizer step takes "
        "worker.actor.global_batch_size prompts x worker.rollout.n samples",
    ),
    "gradient_accumulation_steps": (
        "worker.actor.global_batch_size",
        "TRL's gradient_accumulation_steps: easyrl accumulates micro-batches until worker.actor.global_batch_size "
        "prompts' samples make one optimizer step",
    ),
    "scale_rewards": (
        "algorithm.norm_adv_by_std_in_grpo",
        "TRL's scale_rewards: false (Dr. GRPO) divides by no standard deviation",
    ),
    "importance_sampling_level": (
        "worker.actor.loss_type",
        "TRL's importance_sampling_level: sequence is GSPO, worker.actor.loss_type=gspo",
    ),
    "chat_template_kwargs": ("data.apply_chat_template_kwargs", "TRL's chat_template_kwargs"),
    "eval_strategy": ("trainer.val_freq", "TRL's eval_strategy: validation every trainer.val_freq steps, -1 never"),
    "use_vllm": ("worker.rollout.name", "TRL's use_vllm: easyrl samples with vLLM (worker.rollout.name=vllm)"),
    "num_generations": ("worker.rollout.n", "TRL's num_generations: samples per prompt"),
    "max_completion_length": ("data.max_response_length", "TRL's max_completion_length, in tokens"),
    "num_train_epochs": ("trainer.total_epochs", "TRL's num_train_epochs"),
    "num_iterations": ("ppo_epochs", "TRL's num_iterations: passes over each batch"),
    "beta": ("algorithm.kl_coef", "TRL's beta; the KL is a loss term with algorithm.use_kl_loss=true"),
    "epsilon": ("clip_ratio_low", "TRL's epsilon: the ratio's lower clip is 1 - clip_ratio_low"),
    "epsilon_high": ("clip_ratio_high", "TRL's epsilon_high: the ratio's upper clip is 1 + clip_ratio_high"),
    "model_name_or_path": ("model_path", "TRL's model_name_or_path"),
    "report_to": ("trainer.logger", "TRL's report_to: a list of loggers"),
    "output_dir": ("trainer.save_checkpoint_path", "TRL's output_dir: checkpoints are written there"),
    "save_steps": ("trainer.save_freq", "TRL's save_steps: steps between checkpoints"),
    "eval_steps": ("trainer.val_freq", "TRL's eval_steps: steps between validations"),
}
# verl's sections, compared as easyrl's when a suggestion is ranked (actor_rollout_ref.actor.optim.lr is nearest
# worker.actor.optim.lr)
FOREIGN_SECTION_NAMES = {"actor_rollout_ref": "worker", "fsdp_config": "fsdp", "reward_model": "reward"}


# Keys that mean something else in easyrl than in EasyR1, with what differs and why (docs/config.md lists them all;
# a difference that applies to one run, such as enforce_eager on a machine without CUDA, is a note of its run plan).
EASYR1_DIFFERENCES: dict[str, str] = {
    "trainer.load_checkpoint_path": (
        "a checkpoint outside the run's folder (a warm start) is where the run starts; once the run has saved its "
        "own, a rerun of the same command goes on from the newest of those, as verl's resume_mode=auto does (EasyR1 "
        "goes back to the warm start every time: a requeued job trained the same steps again and save_limit deleted "
        "its newer saves). Give the run a new trainer.save_checkpoint_path to start from the warm start again"
    ),
    "worker.actor.optim.lr": (
        "a run resumed from a checkpoint trains with its config's peak lr, weight_decay, betas and eps from the next "
        "step on, at the schedule's place, and says which changed (EasyR1 keeps the checkpoint's without a word, so a "
        "new lr given on resume was ignored)"
    ),
    "algorithm.adv_estimator": (
        "group and batch statistics (mean, std, leave-one-out sums, whitening) are computed in float64, so a group "
        "of equal rewards gets advantages of exactly 0 (EasyR1's float32 gives |A| up to 0.056 for 16 rewards of "
        "0.9: noise trained as signal)"
    ),
    "worker.actor.global_batch_size": (
        "when a batch makes exactly one optimizer step (ppo_epochs 1, global_batch_size = rollout_batch_size) and "
        "the KL is not in the reward, easyrl skips EasyR1's separate old-log-prob pass and uses the update's own "
        "detached log-probs (the ratio is exactly 1 at that step, so the loss and its gradient are the same); "
        "algorithm.recompute_old_log_probs=true restores the pass"
    ),
    "trainer.logger": (
        "training metrics carry EasyR1's names (reward/<score>, critic/score/*, response_length/*, perf/*), "
        "but actor/pg_clipfrac_higher and actor/pg_clipfrac_lower count the tokens clipped at 1 + clip_ratio_high "
        "(advantage > 0) and at 1 - clip_ratio_low (advantage < 0), the dual clip in actor/pg_clipfrac_dual (EasyR1: "
        "_higher counts both sides, _lower the dual clip), so each side of clip-higher can be read; validation and "
        "timings do not carry EasyR1's names: val/reward/<score> and val/<data_source>/reward (EasyR1: "
        "val/<score>_reward, val/reward_score, val_response_length/*), timing/<phase> in seconds (EasyR1: "
        "timing_s/<phase>). A "
        "dashboard built on EasyR1's validation keys needs the new names"
    ),
    "trainer.critic_warmup": (
        "the actor's learning-rate schedule spans the steps after the warm-up, the ones that update it (EasyR1 and "
        "verl size it over every step while the actor's scheduler stands still in the warm-up, so a cosine schedule "
        "ended at 0.105 of the peak for 100 steps with a warm-up of 20, not at its floor)"
    ),
    "trainer.val_before_train": (
        "validates before the first step of a run that starts afresh, not again when a run resumes (EasyR1 "
        "validates at every resume); trainer.val_only validates the resumed checkpoint"
    ),
    "worker.rollout.disable_tqdm": (
        "defaults to true (EasyR1: false): the run prints one progress bar of its own instead of one bar per "
        "generate call"
    ),
    "data.format_prompt": (
        "a template file that does not exist is an error (EasyR1 prints 'not found' and trains without a "
        "template, which silently changes every prompt), except EasyR1's own math/r1v/dapo/android_gui templates, "
        "which easyrl ships with the same text"
    ),
    "worker.reward.reward_function": (
        "without `:function`, `main` is called when the file defines it and `compute_score` otherwise (EasyR1: always "
        "`main`, which its own reward files do not define); a score that is not a number, a batch result of the "
        "wrong length or a missing `overall` is an error instead of a silent 0; a function that raises, returns "
        "NaN/inf (EasyR1 passes it to the update), ends its process or is still running when worker.reward.timeout_s "
        "(one deadline for the whole batch; EasyR1 has none) runs out scores 0 for its samples and is counted in "
        "reward/errors (timeouts also in reward/timeouts) instead of stopping the run"
    ),
    "worker.reward.num_cpus": (
        "0 scores in one reward actor that reserves no CPU, as EasyR1 does, under the same timeout and protection as "
        "any other number"
    ),
    "data.image_key": (
        "a row with pictures but no `<image>` placeholder in its prompt gets its pictures before the text (EasyR1's "
        "processor fails on such rows)"
    ),
    "worker.actor.model.trust_remote_code": (
        "defaults to false (EasyR1: true): code shipped with a checkpoint runs in the driver and every worker, so it "
        "runs only when asked for; a model that needs it stops before Ray starts with an error naming this key"
    ),
    "data.answer_key": (
        "a row whose answer is null or absent is skipped, counted and named in a warning (EasyR1 hands None to the "
        "reward function, which then scores 0 or raises); no row with an answer is an error naming the key. The "
        "same holds for data.prompt_key"
    ),
    "data.train_files": (
        "every row is read and encoded when the run starts, so a file that cannot be read (no rows, a byte that is "
        "not UTF-8, a line that is not JSON) stops the run before Ray starts, naming the file and line (EasyR1 "
        "finds such rows when it draws them); CSV cells are read as the text they hold (EasyR1: numbers where they "
        "look like numbers, so an answer `06` becomes 6.0). With data.filter_overlong_prompts=false the prompts are "
        "measured too, and the number that will be cut is reported at the start"
    ),
    "worker.rollout.enforce_eager": (
        "false on a machine without CUDA runs the engine eagerly all the same (CUDA graphs do not exist there; "
        "vLLM's CPU backend dies at start otherwise), announced once"
    ),
    "worker.actor.model.lora.rank": (
        "LoRA also covers vision-language models: the vision encoder gets no adapters unless "
        "worker.actor.model.lora.vision_tower=true (EasyR1 relies on an exclude_modules regex for that, which easyrl "
        "honours too); the LM head never gets one; target_modules may be a list; a checkpoint holds only the adapters "
        "and their optimizer state, and its huggingface/ folder is a peft adapter folder (EasyR1 writes a separate "
        "lora_adapter/); LoRA on the critic is refused"
    ),
    "worker.actor.clip_ratio_dual": (
        "bounds the default (PPO) loss only: gspo and gspo_token clip the sequence-level ratio without a dual clip, as "
        "the GSPO paper and verl do (EasyR1 applies it to them too; with GSPO's narrow clip range a sequence ratio "
        "beyond it is rare), and cispo and sapo have none in either"
    ),
    "worker.actor.ulysses_size": (
        "also runs for vision-language models (EasyR1: text only); a model with fewer key/value heads than the size "
        "repeats each head over the ranks (as verl does; the size must then be a multiple of them), and one whose "
        "heads cannot be split is refused before Ray starts, naming the key and the sizes that work; the driver sends "
        "each sequence-parallel group one chunk of the batch instead of gathering inside the group"
    ),
    "worker.actor.micro_batch_size_per_device_for_update": (
        "with dynamic_batching (the default) it only sets the token budget, so the samples per device need not be a "
        "multiple of it (EasyR1 asserts they are); with dynamic_batching=false the check stays, before Ray starts"
    ),
}
