"""`replayproxy capacity`: whether a model fits a GPU and how much KV cache a workload keeps resident.

A feature of its own, about a model rather than about results: presets (published HF configs) ->
memory (weights, KV bytes per token, the KV budget) and residency (tokens held over time from a
trace's or a replay's timings) -> command. Formulas: docs/capacity.md.
"""
