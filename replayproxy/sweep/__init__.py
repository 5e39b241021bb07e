"""`replayproxy sweep`: one engine's operating line on one trace, each load step a replay subprocess.

Glue: it runs replays (`steps`, also what `tune` measures each configuration with) and hands their
result files to the report's sweep analysis (report.sweep). Only the CLI imports its `command`.
"""
