"""easyrl: reinforcement-learning post-training for language and vision-language models."""

from .utils.runtime_env import prepare_process_environment


__version__ = "0.1.0"

prepare_process_environment()
