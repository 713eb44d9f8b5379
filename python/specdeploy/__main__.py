"""`python -m specdeploy`: the same CLI as the `specdeploy` command."""

from specdeploy.cli import main

main()
