"""The configuration of a run: the typed schema (``schema``), EasyR1 compatibility (``compat``), loading (``load``),
validation (``validate``) and the run plan every other part reads (``plan``)."""

from ..paths import BUILTIN_PREFIX, PROJECT_ROOT, resolve_shipped_file
from .load import config_to_dict, config_to_yaml, derive, load_config, read_config, valid_keys
from .plan import RunPlan, load_run_plan, make_run_plan
from .schema import (
    ActorConfig,
    AlgorithmConfig,
    ConfigError,
    CriticConfig,
    DataConfig,
    FSDPConfig,
    LoraConfig,
    ModelConfig,
    OffloadConfig,
    OptimConfig,
    PPOConfig,
    RefConfig,
    RewardConfig,
    RolloutConfig,
    TrainableRoleConfig,
    TrainerConfig,
    WorkerConfig,
)
from .validate import uses_critic, validate_config


__all__ = [
    "BUILTIN_PREFIX",
    "PROJECT_ROOT",
    "ActorConfig",
    "AlgorithmConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "FSDPConfig",
    "LoraConfig",
    "ModelConfig",
    "OffloadConfig",
    "OptimConfig",
    "PPOConfig",
    "RefConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunPlan",
    "TrainableRoleConfig",
    "TrainerConfig",
    "WorkerConfig",
    "config_to_dict",
    "config_to_yaml",
    "derive",
    "load_config",
    "load_run_plan",
    "make_run_plan",
    "read_config",
    "resolve_shipped_file",
    "uses_critic",
    "valid_keys",
    "validate_config",
]
