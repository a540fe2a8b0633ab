"""Plans on real devices: split a model by a placement plan, pipeline it over worker processes (one per
device), check it against the unsplit model, and time its training steps beside the simulator's.

``split`` cuts an exported model into stages, ``worker`` runs one device's stages, ``pipeline`` starts and
drives the workers, ``measure`` times tasks, and ``run`` (:func:`gpualloc.execute.run.execute_plan`) ties
them to a plan file and the simulator; ``hybrid`` (:func:`gpualloc.execute.hybrid.execute_hybrid`) runs
version-2 (data x pipeline parallel) plans. Nothing is imported here: a worker process imports only what it
runs.
"""
