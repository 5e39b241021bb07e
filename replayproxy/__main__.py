"""`python -m replayproxy` is the same as the `replayproxy` console script."""

from replayproxy.cli import main

raise SystemExit(main())
