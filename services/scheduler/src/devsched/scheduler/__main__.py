"""`python -m devsched.scheduler`: the same as the `devsched-scheduler` console script."""

import sys

from devsched.scheduler.main import main

sys.exit(main())
