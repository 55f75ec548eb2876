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


# Keys that mean something else in easyrl than in EasyR1, with what differs. Each is announced once when a config
# sets the key explicitly (a user relying on EasyR1's meaning learns of the difference before the run starts).
EASYR1_DIFFERENCES: dict[str, str] = {
    "worker.rollout.disable_tqdm": (
        "defaults to true in easyrl (EasyR1: false): the run prints one progress bar of its own instead of one bar "
        "per generate call"
    ),
    "worker.actor.use_torch_compile": (
        "compiles easyrl's log-prob and entropy kernels on GPUs; on a CPU the eager kernels run (compiling them "
        "there costs more than it saves)"
    ),
}


def easyr1_difference_notes(user_keys: set[str]) -> list[str]:
    """One note per key the user set whose meaning differs from EasyR1's."""
    return [f"`{key}` {why}." for key, why in EASYR1_DIFFERENCES.items() if key in user_keys]
