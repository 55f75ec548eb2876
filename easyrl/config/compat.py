"""EasyR1 compatibility: other spellings of keys and choices that load unchanged, and the keys whose meaning in
easyrl differs from EasyR1's (a warning names each one a config relies on; docs/config.md gives the reasons)."""

from typing import Any


# EasyR1 spells some choices and keys differently across versions; both spellings load.
LOSS_AVG_MODE_ALIASES = {"token": "token-mean", "seq": "seq-mean-token-mean"}
LOSS_TYPE_ALIASES = {"default": "ppo", "vanilla": "ppo"}
LEGACY_KEYS = {
    "worker.actor.ulysses_sequence_parallel_size": "worker.actor.ulysses_size",
    "worker.critic.ulysses_sequence_parallel_size": "worker.critic.ulysses_size",
    "worker.ref.ulysses_sequence_parallel_size": "worker.ref.ulysses_size",
    "worker.reward.score_function": "worker.reward.reward_function",
    "worker.reward.score_function_kwargs": "worker.reward.reward_function_kwargs",
    "trainer.total_episodes": "trainer.total_epochs",
}
# Keys older EasyR1 configs carry that no longer mean anything: accepted and ignored.
IGNORED_LEGACY_KEYS = {"worker.reward.reward_type", "worker.reward.compute_score"}


def rename_legacy(flat: dict[str, Any]) -> dict[str, Any]:
    """Flat {dotted key: value} with legacy keys renamed and ignored ones dropped."""
    return {LEGACY_KEYS.get(key, key): value for key, value in flat.items() if key not in IGNORED_LEGACY_KEYS}


# Keys that mean something else in easyrl than in EasyR1, with what differs and why (docs/config.md lists them all;
# a difference that applies to one run, such as enforce_eager on a machine without CUDA, is a note of its run plan).
EASYR1_DIFFERENCES: dict[str, str] = {
    "algorithm.adv_estimator": (
        "group and batch statistics (mean, std, leave-one-out sums, whitening) are computed in float64, so a group "
        "of equal rewards gets advantages of exactly 0 (EasyR1's float32 gives |A| up to 0.056 for 16 rewards of "
        "0.9: noise trained as signal)"
    ),
    "worker.actor.global_batch_size": (
        "when a batch makes exactly one optimizer step (ppo_epochs 1, global_batch_size >= rollout_batch_size) and "
        "the KL is not in the reward, easyrl skips EasyR1's separate old-log-prob pass and uses the update's own "
        "detached log-probs (the ratio is exactly 1 at that step, so the loss and its gradient are the same); "
        "algorithm.recompute_old_log_probs=true restores the pass"
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
    "worker.actor.ulysses_size": (
        "also runs for vision-language models (EasyR1: text only); a model with fewer key/value heads than the size "
        "repeats each head over the ranks (as verl does; the size must then be a multiple of them), and one whose "
        "heads cannot be split is refused before Ray starts, naming the key and the sizes that work; the driver sends "
        "each sequence-parallel group one chunk of the batch instead of gathering inside the group"
    ),
}
