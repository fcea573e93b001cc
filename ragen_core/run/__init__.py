"""The run layer: one run's life, from the decision to start to its last commit.

Rooms (each a module; lower packages -- training, storage, rollout, envs, algos, agent, policy -- never import
this one):

- :mod:`~ragen_core.run.requests`: a command's typed request (config validated, run id checked, lake made), built
  once by whichever door starts it (the CLI, a deployment's flow run, the Python API);
- :mod:`~ragen_core.run.procedures`: a command's course through this layer (admit the request: the writer lock and
  the start decision; then train, evaluate, retrain), run step by step by a flow or directly by the API;
- :mod:`~ragen_core.run.entry`: one entry for a run (its id checked, its lake, its writer lock taken once), used by
  train, retrain, evaluate and the CLI;
- :mod:`~ragen_core.run.checks`: a run's config checked against the registries after the config package validated
  its plain data (``build_run_config`` / ``load_run_config``, what every entry loads a config with);
- :mod:`~ragen_core.run.decisions`: fresh / over / resume / done and the resume plan, pure functions of what is
  stored;
- :mod:`~ragen_core.run.record`: the manifest and the run's status (running -> completed / failed / interrupted);
- :mod:`~ragen_core.run.session`: the session (config, lake, run id, schedule, rollout policy, updater, record);
- :mod:`~ragen_core.run.schedule`: the run's schedule, synchronous or overlapped, chosen once from
  ``trainer.max_staleness`` (its one reader); :mod:`~ragen_core.run.overlap` runs the iterations as it says;
- :mod:`~ragen_core.run.batches`: the batch pipeline every stored batch passes (stage -> validate -> filter ->
  publish);
- :mod:`~ragen_core.run.stages`: the stages of one iteration and their tables, which
  :mod:`~ragen_core.run.iteration` runs (timed by :mod:`~ragen_core.run.clock`); :mod:`~ragen_core.run.resume`:
  restoring a session;
- :mod:`~ragen_core.run.bootstrap`, :mod:`~ragen_core.run.evaluation`, :mod:`~ragen_core.run.offline`: the bootstrap,
  stand-alone evaluation and offline re-training; :mod:`~ragen_core.run.chat`: the chat a trained policy is sent.

The rollout side (backends, the sampler process, the rollout policy, the weight hand-off) is the rollout room,
:mod:`ragen_core.rollout` (an async run's sampler process is ``python -m ragen_core.rollout.sampler``). The entry
point of a launched update group's processes is :mod:`ragen_core.training.worker`.
"""
