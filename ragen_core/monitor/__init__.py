"""Monitoring (the config's ``monitor`` section): what a run measures and shows about itself.

- :mod:`~ragen_core.monitor.metrics`: rollout, filter, throughput and collapse metrics and warnings;
- :mod:`~ragen_core.monitor.diagnostics`: reasoning mutual information and the other model-side diagnostics;
- :mod:`~ragen_core.monitor.tensorboard_sink`: metrics rows as TensorBoard scalars;
- :mod:`~ragen_core.monitor.trackers`: the experiment trackers a run logs to (TensorBoard, MLflow, W&B);
- :mod:`~ragen_core.monitor.reports`: the iteration's line and Markdown report;
- :mod:`~ragen_core.monitor.plots`: the collapse-indicator PNG of ``ragen plot``.

It sits above storage and training (it reads the lake, scores with the policy) and below the run layer.
"""
