"""`python -m clients.reference_trainer`: see clients.reference_trainer.cli."""

import sys

from clients.reference_trainer.cli import main

sys.exit(main())
