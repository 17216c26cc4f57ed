"""Where the loop logs: the tracking settings, kept light (pydantic only) so that validating a
config imports no MLflow. `sparring.tracking` does the logging."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field


class TrackingConfig(BaseModel):
    """Where and under which experiment a pipeline logs."""

    model_config = ConfigDict(extra="forbid")

    # False: no MLflow at all (the benches): checkpoints are still stored, under
    # <storage.root>/<run>/<iteration>/checkpoint, but nothing is logged or registered.
    enabled: bool = True
    tracking_uri: str | None = None  # None = $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db
    experiment: str = "sparring"  # one experiment per pipeline
    artifact_location: str | None = None  # run artifacts of a NEW experiment, e.g. s3://b/mlflow
    probe_timeout: float = Field(5.0, gt=0)  # seconds to wait for an http(s) server's /health
    # The storage URI behind the server's `mlflow-artifacts:/` (its --artifacts-destination).
    # Checkpoints under it register with proxied sources: loaders need only the tracking URI.
    artifacts_destination: str | None = None

    def resolved_uri(self) -> str:
        """The tracking URI this config means."""
        return self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
