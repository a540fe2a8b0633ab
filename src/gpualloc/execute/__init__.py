"""Plans on real devices: the torch-native engine (:mod:`gpualloc.execute.engine`) runs every plan, op-level or
hybrid, under torchrun; ``split`` cuts an exported model into the engine's stages and ``measure`` takes a
region's peak memory. Nothing is imported here: a rank imports only what it runs.
"""
