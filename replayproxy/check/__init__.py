"""Output check: the same evaluation prompts to every candidate at pinned sampling, answers compared.

prompts (the user's own set, or a built-in one) -> requests -> client -> scoring -> a .rpc file
(replayproxy.results) that `replayproxy report` reads. Replay cannot show this: its prompts are
synthetic and it forces output lengths.
"""
