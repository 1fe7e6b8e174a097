"""Builders of upstream MLIR on tensors: element types, constants, slices and layouts.

Shared by every stage that writes IR (the StableHLO importer, the passes, the GPU target),
so that none of them reaches into another for its helpers.
"""
