"""The estimator's torch code: traced memory (traced, torch_models), the one-device stage profiler
(stage_profiler) and the collective profiler (comm_profile).

The pure library above never imports this package (the Cell estimator takes a profiler through
compute.OperatorProfiler). torch itself is imported at module level only by torch_models; traced,
stage_profiler and comm_profile import without torch and load it when a trace or a profile runs.
"""
