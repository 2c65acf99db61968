"""`python -m tessera.clients.trainer.reference`: see tessera.clients.trainer.reference.cli."""

import logging
import os
import sys

from tessera.clients.trainer.reference.cli import main

code = main()
# Everything that matters is done (checkpoint fsynced and published, process group destroyed, the
# agent told): skip the interpreter's teardown of torch's modules, which takes seconds on a small
# machine and would only delay the end of a stop (a migration's critical path).
sys.stdout.flush()
sys.stderr.flush()
logging.shutdown()
os._exit(code)
