"""``python -m gpu_efficiency.sim ...``: the same as ``gpu-efficiency sim ...``."""

import sys

from gpu_efficiency.sim.cli import main

sys.exit(main())
