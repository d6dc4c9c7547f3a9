"""`python -m devsched.sweeper`: the same as the `devsched-sweeper` console script."""

import sys

from devsched.sweeper.main import main

sys.exit(main())
