"""The names of the files in a run folder (docs/results.md describes each), shared by the side that
writes them (the launcher, the trainer's services, the provenance record) and the side that reads
them (:mod:`lsgd.analysis`), which must not import the training side to learn a file name.
"""

from __future__ import annotations

#: the resolved run config, written by the launcher before any worker starts
CONFIG_FILE = "config.yaml"
#: one JSON record per logged step (the metrics of the glossary)
METRICS_FILE = "metrics.jsonl"
#: the run's final figures and status (``finished``, ``interrupted``, ``preempted``, ``failed``)
SUMMARY_FILE = "summary.json"
#: what produced the run: code, software, machine (:mod:`lsgd.training.provenance`)
ENVIRONMENT_FILE = "environment.json"
#: how the report's labels and the loggers write the run (``"local SGD, H=8"``): the words of its
#: method's and compressor's registry entries (:mod:`lsgd.core.labels`), written by the launcher
LABELS_FILE = "labels.json"
