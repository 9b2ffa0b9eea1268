"""Networks of the paper, with the original's initialisation."""

from edps_mlflow.models.init import init_fan_in_truncated_normal
from edps_mlflow.models.simple_cnn import SimpleCNN

__all__ = ["SimpleCNN", "init_fan_in_truncated_normal"]
