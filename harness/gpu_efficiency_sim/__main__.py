"""``python -m gpu_efficiency_sim ...``: the same as ``gpu-efficiency-sim ...``."""

import sys

from gpu_efficiency_sim.cli import main

sys.exit(main())
