import sys

from devsched.web.main import main

sys.exit(main())
