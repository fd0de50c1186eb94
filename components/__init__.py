"""Kubeflow Pipelines components of omtr: one lightweight Python component per step, each running
one `omtr` subcommand in the omtr image (see steps.py). The pipeline is in pipelines/."""
