import os
import sys

from oat_dppo.study.cli import main

try:
    sys.exit(main())
except BrokenPipeError:  # `--dry-run | head`: the reader left
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)
