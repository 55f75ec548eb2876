"""Logger backends by the name used in ``trainer.logger``."""

from collections.abc import Callable

from .base import Logger


LOGGERS: dict[str, type[Logger]] = {}


def register_logger(name: str) -> Callable[[type[Logger]], type[Logger]]:
    def decorator(cls: type[Logger]) -> type[Logger]:
        if name in LOGGERS:
            raise ValueError(f"logger '{name}' is already registered by {LOGGERS[name].__qualname__}")
        LOGGERS[name] = cls
        return cls

    return decorator


def get_logger_class(name: str) -> type[Logger]:
    if name not in LOGGERS:
        raise ValueError(f"trainer.logger: unknown logger '{name}'; choose from {sorted(LOGGERS)}.")
    return LOGGERS[name]
