"""MLflow. Uses ``$MLFLOW_TRACKING_URI`` when set; otherwise a local store under ``<save_dir>/mlflow``."""

import os
import re

from .base import Logger, RunInfo, explain_start_failure, flatten_dict, generation_columns, import_backend
from .registry import register_logger


# MLflow accepts letters, digits and `_ - . / space` in metric and parameter names.
_INVALID_NAME_CHARS = re.compile(r"[^\w\-./ ]")
# MLflow rejects parameter values longer than this.
_MAX_PARAM_CHARS = 6000


def mlflow_name(name: str) -> str:
    """``val/math@test/score`` -> ``val/math_at_test/score``: keys MLflow would reject, made valid."""
    return _INVALID_NAME_CHARS.sub("_", name.replace("@", "_at_"))


@register_logger("mlflow")
class MlflowLogger(Logger):
    def __init__(self, run: RunInfo) -> None:
        super().__init__(run)
        mlflow = import_backend("mlflow", "mlflow", "mlflow")
        self._mlflow = mlflow
        local_root = os.path.abspath(os.path.join(run.save_dir, "mlflow"))
        # Decided once: set_tracking_uri exports MLFLOW_TRACKING_URI itself.
        use_local_store = not os.environ.get("MLFLOW_TRACKING_URI")
        if use_local_store:
            os.makedirs(local_root, exist_ok=True)
            mlflow.set_tracking_uri(f"sqlite:///{os.path.join(local_root, 'mlflow.db')}")
        with explain_start_failure("mlflow", "Check MLFLOW_TRACKING_URI (unset it for a local store)"):
            if mlflow.get_experiment_by_name(run.project_name) is None:
                # A local store keeps artifacts next to it, not in the current directory (MLflow's default).
                artifacts = os.path.join(local_root, "artifacts") if use_local_store else None
                mlflow.create_experiment(run.project_name, artifact_location=artifacts)
            mlflow.set_experiment(run.project_name)
            self.mlflow_run = mlflow.start_run(run_name=run.experiment_name)
        params = {mlflow_name(k): str(v)[:_MAX_PARAM_CHARS] for k, v in flatten_dict(run.config).items()}
        if params:
            mlflow.log_params(params)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._mlflow.log_metrics({mlflow_name(name): value for name, value in metrics.items()}, step=step)

    def log_generations(self, samples: list[dict], step: int) -> None:
        columns = generation_columns(samples)
        table = {column: [sample.get(column) for sample in samples] for column in columns}
        self._mlflow.log_table(table, artifact_file=f"generations/step_{step}.json")

    def finish(self) -> None:
        self._mlflow.end_run()
