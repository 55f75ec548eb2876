"""MLflow. Uses ``$MLFLOW_TRACKING_URI`` when set; otherwise a local store under ``<save_dir>/mlflow``.

A run resumed from a checkpoint continues the MLflow run of the attempt it resumes, when the tracking store holds it.
"""

import logging
import os
import re

from .base import Logger, RunInfo, explain_start_failure, flatten_dict, generation_columns, import_backend
from .registry import register_logger


logger = logging.getLogger(__name__)

# MLflow accepts letters, digits and `_ - . / space` in metric and parameter names.
_INVALID_NAME_CHARS = re.compile(r"[^\w\-./ ]")
# MLflow rejects parameter values longer than this.
_MAX_PARAM_CHARS = 6000


def mlflow_name(name: str) -> str:
    """``val/math@test/score`` -> ``val/math_at_test/score``: keys MLflow would reject, made valid."""
    return _INVALID_NAME_CHARS.sub("_", name.replace("@", "_at_"))


@register_logger("mlflow")
class MlflowLogger(Logger):
    append_only = True

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
            self.mlflow_run = self._continue_run(run.resume.get("id")) or mlflow.start_run(
                run_name=run.experiment_name
            )
        params = {mlflow_name(k): str(v)[:_MAX_PARAM_CHARS] for k, v in flatten_dict(run.config).items()}
        held = self.mlflow_run.data.params
        changed = sorted(name for name, value in params.items() if name in held and held[name] != value)
        if changed:
            # MLflow refuses to change a logged parameter: the run keeps the values of its first attempt
            logger.warning(
                "mlflow: the resumed run's config differs from the first attempt's in %s; MLflow keeps the first "
                "attempt's values of these parameters.",
                ", ".join(changed),
            )
        params = {name: value for name, value in params.items() if name not in held}
        if params:
            mlflow.log_params(params)

    def _continue_run(self, run_id: str | None):
        """The earlier attempt's run, reopened; None (a new run is started) when the store does not hold it."""
        if not run_id:
            return None
        try:
            return self._mlflow.start_run(run_id=run_id)
        except self._mlflow.exceptions.MlflowException as error:
            logger.warning(
                "mlflow: cannot continue run %s of the earlier attempt (%s); starting a new run.", run_id, error
            )
            return None

    def resume_state(self) -> dict:
        return {"id": self.mlflow_run.info.run_id}

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._mlflow.log_metrics({mlflow_name(name): value for name, value in metrics.items()}, step=step)

    def log_generations(self, samples: list[dict], step: int) -> None:
        columns = generation_columns(samples)
        table = {column: [sample.get(column) for sample in samples] for column in columns}
        self._mlflow.log_table(table, artifact_file=f"generations/step_{step}.json")

    def finish(self) -> None:
        self._mlflow.end_run()
