"""Plans on real devices: split a model by a placement plan, pipeline it over worker processes (one per
device), check it against the unsplit model, and time its training steps beside the simulator's.

``split`` cuts an exported model into stages, ``worker`` runs one device's stages, ``pipeline`` starts and
drives the workers, ``measure`` times tasks, and ``run`` (:func:`gpualloc.execute.run.execute_plan`) ties
them to a plan file and the simulator (operator plans, version 1). Hybrid plans (version 2) run on the
torch-native engine under torchrun, :mod:`gpualloc.execute.engine`. Nothing is imported here: a worker process
imports only what it runs.
"""
