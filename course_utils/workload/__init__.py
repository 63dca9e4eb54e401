"""The shared workload: the click-log data, the DLRM, its metrics and one training loop.

* ``data``: synthetic click logs (and Criteo's files from a path you give), parquet, loaders;
* ``models``: the DLRM (``DLRM``, ``DLRMConfig``) and a plain MLP;
* ``metrics``: AUC, log loss, timers; ``global_auc`` and ``streaming_auc``: the AUC over ranks,
  exact (gathered) and binned (one all-reduce of score histograms);
* ``train``: ``fit``, the one training loop every chapter reuses.

Layer 2 of CONTRIBUTING.md's tree: imports only ``course_utils.runtime`` and ``course_utils.notebook``
(``lint-imports`` checks it).

Taught in chapter 01 (the data, the model and the loop every later chapter distributes).
"""
