"""Experiment tracking: console, JSON lines, TensorBoard, Weights & Biases, SwanLab and MLflow.

Each backend's library is imported only when that backend is chosen in ``trainer.logger``.
"""

# Importing the backend modules registers them; their libraries are imported only when a backend is built.
from . import console, file, mlflow, swanlab, tensorboard, wandb  # noqa: F401
from .base import Logger, LoggerStartError, MissingLoggerPackage, RunInfo
from .registry import LOGGERS, get_logger_class, register_logger
from .tracker import Tracker


__all__ = [
    "LOGGERS",
    "Logger",
    "LoggerStartError",
    "MissingLoggerPackage",
    "RunInfo",
    "Tracker",
    "get_logger_class",
    "register_logger",
]
