"""`python -m devsched.client`: the `devsched` command line."""

from devsched.client.cli import main

main()
