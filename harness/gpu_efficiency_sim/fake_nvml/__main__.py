"""``python -m gpu_efficiency_sim.fake_nvml agent ...``: ``gpu-efficiency-sim agent`` alone."""

import sys

from gpu_efficiency_sim.fake_nvml.command import main

sys.exit(main())
