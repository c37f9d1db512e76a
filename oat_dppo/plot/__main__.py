"""`python -m oat_dppo.plot RUN_DIR [RUN_DIR ...]` (see `--help`)."""

import sys

from oat_dppo.plot.cli import main

sys.exit(main())
