import sys

from bench.sim.run import main

sys.exit(main())
