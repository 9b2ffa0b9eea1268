"""edps-mlflow: steps-to-result vs batch size and sparsity, tracked in MLflow.

Run one study:  ``edps study --bs 256``  or  ``mlflow run . -P bs=256``.
"""

__version__ = "0.1.0"
